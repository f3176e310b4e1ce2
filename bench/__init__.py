"""redrive's benchmarks: each runs its peer in the same run and prints the ratio first."""
