"""What an App does with a record whose redrive headers it cannot believe.

A record that comes back to an App (a tier, the single retry topic, the group's own
retry topic, a delivery on the source topic) carries its past in its redrive headers:
its attempt, its original coordinates, its ``redrive-id``. Anyone who may write one of
those topics may write those headers, and stream processors copy them along, so the
App believes them only where :class:`redrive.returns.ReturnCheck` does (they name the
topic read, and with keys they carry one of the App's signatures). Where it cannot:

- on a source topic the record is a new record: handled at attempt 1, named by where
  it was read, never a repeat of another (counted as
  ``redrive_consumer_records_total{outcome="untrusted_headers"}`` besides its own
  outcome, logged at info);
- on a retry path it is refused, never handled and never used to skip another record,
  the way the App's ``returns`` setting says: :class:`RefuseToDeadLetters` (the
  default: a dead letter on the route's dead letters, its reason saying why, nothing
  lost) or :class:`RefuseAndCount` (counted, logged at warning, and dropped). Either
  way it counts as ``redrive_consumer_records_total{outcome="refused"}``. With keys, a
  record on a retry path without redrive headers of its group is refused too: only
  the App, the retry service and the Spark scheduler write there, and they sign.

``trust_unsigned=True`` (either rule) is for rolling signing out: while senders and
the retry service are moved to keys, an unsigned return is believed as without keys
(a signature naming one of the App's keys must still verify), and so is an unsigned
bookkeeping record of key order (:mod:`redrive.consumer.bookkeeping`).

Invariant: the setting is one of the two values, checked when the App is made (a
ConfigError naming ``App(returns=...)`` otherwise), and ``trust_unsigned`` means
something only with keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from redrive.errors import ConfigError
from redrive.returns import ReturnCheck
from redrive.signing import KeyRing

SETTING = "App(returns=...)"


@dataclass(frozen=True, slots=True)
class RefuseToDeadLetters:
    """A return the App cannot believe becomes a dead letter on its route's dead
    letters (``<topic>.dlq`` or the retry service's store), its key and value byte for
    byte, error ``redrive.consumer.RefusedReturnError`` and reason ``return refused:
    <why>``; nothing is lost."""

    trust_unsigned: bool = False
    """Believe unsigned returns while senders are rolled over to signing."""


@dataclass(frozen=True, slots=True)
class RefuseAndCount:
    """A return the App cannot believe is counted and logged at warning (topic,
    partition, offset, why), and dropped: nothing is written for it."""

    trust_unsigned: bool = False
    """Believe unsigned returns while senders are rolled over to signing."""


ReturnRule: TypeAlias = RefuseToDeadLetters | RefuseAndCount
"""What ``App(returns=...)`` and ``ShareApp(returns=...)`` take."""

DEFAULT_RULE = RefuseToDeadLetters()

NOT_A_RETURN = (
    "it carries no redrive headers of this group, and on a retry path of an App with "
    "signing keys every record is a return signed by them"
)
"""Why a record without redrive headers of its group is refused on a retry path."""


def checked_rule(rule: object, keys: KeyRing | None, setting: str = SETTING) -> ReturnRule:
    """``returns=`` as given, or a ConfigError naming ``setting``: a rule of its own
    type, whose ``trust_unsigned`` is a bool, and True only for an App with keys (an
    App without keys believes unsigned returns anyway: the operator meant to give it
    keys)."""
    if not isinstance(rule, RefuseToDeadLetters | RefuseAndCount):
        raise ConfigError(
            setting,
            f"{rule!r:.200} is not a rule for refused returns",
            "use RefuseToDeadLetters() (the default) or RefuseAndCount()",
        )
    if not isinstance(rule.trust_unsigned, bool):
        raise ConfigError(
            setting,
            f"trust_unsigned={rule.trust_unsigned!r:.100} is not True or False",
            f"use {type(rule).__name__}(trust_unsigned=True) while rolling signing out",
        )
    if rule.trust_unsigned and keys is None:
        raise ConfigError(
            setting,
            "trust_unsigned=True is for an App with signing keys, and this App has none",
            "give it signing=KeyRing.from_settings(...) (or REDRIVE_SIGNING_KEYS / "
            "REDRIVE_SIGNING_KEY_FILES), or leave trust_unsigned out",
        )
    return rule


def return_check(keys: KeyRing | None, rule: ReturnRule) -> ReturnCheck:
    """What the App asks of each return it reads, with its keys and rule."""
    return ReturnCheck(keys, trust_unsigned=rule.trust_unsigned)
