"""`make bench`: run every benchmark and print a table (ratio first, then absolute figures)."""


def main() -> None:
    print("no benchmarks yet")


if __name__ == "__main__":
    main()
