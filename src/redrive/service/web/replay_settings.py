"""A bulk replay's settings as the UI's forms send them: the pace, the start time, a
destination other than each letter's topic, and whether the letters are kept.

They are the fields the API's bulk and group replays take (:class:`ReplayMany`), read
once here for every form that previews or runs a replay of many letters (the list's
bulk form, an error group's, the preview's "Replay these" step), so a preview is asked
with the settings the replay then runs with.
"""

from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import FormData

from redrive.service.web.params import field

# The form fields, besides the selection, that a preview carries to its replay.
SETTING_FIELDS = ("start_at", "rate", "destination", "keep")


def start_time(form: FormData) -> datetime | None:
    """The optional start time (UTC, as a datetime-local input sends it)."""
    text = field(form, "start_at")
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"Bad start time {text!r}: give a date and time (UTC).") from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def _rate(form: FormData) -> float | None:
    text = field(form, "rate")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"Bad rate {text!r}: give messages per second, a number.") from None


def replay_settings(form: FormData) -> dict[str, Any]:
    """The settings given, as fields of a replay request (absent ones left out, so the
    service's defaults apply); ValueError saying which one is wrong. Their ranges are
    the request model's to check, with the same words as the API."""
    settings: dict[str, Any] = {}
    start_at = start_time(form)
    if start_at is not None:
        settings["start_at"] = start_at
    rate = _rate(form)
    if rate is not None:
        settings["rate"] = rate
    destination = field(form, "destination")
    if destination:
        settings["destination"] = destination
    if field(form, "keep") == "1":
        settings["keep"] = True
    return settings


def settings_in_words(settings: dict[str, Any]) -> str:
    """The settings as a confirmation reads them: " to orders.fixed at 5/s, from …"."""
    words = f" to {settings['destination']}" if "destination" in settings else " to their topics"
    if "rate" in settings:
        words += f" at {settings['rate']:,g}/s"
    if "start_at" in settings:
        words += f", from {settings['start_at'].astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    if settings.get("keep"):
        words += ", keeping them"
    return words
