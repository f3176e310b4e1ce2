"""Topics through the broker's admin API: partition counts, and creating topics.

The retry service's intake and the Spark scheduler check each request's destination
against :class:`TopicMetadata` (does it exist, how many partitions); both create
their own topics with :func:`ensure_topic`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

# Where the stubs see them (confluent_kafka.admin re-exports them untyped).
from confluent_kafka.cimpl import NewTopic


class MetadataUnavailable(Exception):
    """The broker could not say whether a topic exists; try again later."""


class TopicMetadata:
    """Partition counts of topics, cached: a full refresh at most every `ttl_s`.

    A topic the cache does not know is looked up again before it is called missing,
    unless a refresh at most `miss_refresh_s` ago already found it missing (so a batch
    of requests for a missing topic costs one metadata request, not one each). A miss
    is never answered from a refresh made before the topic was first asked about: a
    topic created a moment after another topic's miss refreshed the cache is found.
    """

    def __init__(self, admin: AdminClient, ttl_s: float = 30.0, miss_refresh_s: float = 1.0):
        self._admin = admin
        self._ttl_s = ttl_s
        self._miss_refresh_s = miss_refresh_s
        self._partitions: dict[str, int] = {}
        self._refreshed_at = float("-inf")
        self._missing: dict[str, float] = {}  # topic: the refresh that found it missing
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        try:
            metadata = self._admin.list_topics(timeout=10)
        except KafkaException as exc:
            raise MetadataUnavailable(str(exc)) from exc
        self._partitions = {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None
        }
        self._refreshed_at = time.monotonic()
        oldest = self._refreshed_at - self._miss_refresh_s
        self._missing = {t: at for t, at in self._missing.items() if at >= oldest}

    def partitions_of(self, topic: str) -> int | None:
        """Partitions of `topic`, or None if it does not exist. Raises MetadataUnavailable."""
        # Asked once per request: a fresh, known topic is answered without the lock (the
        # cache is replaced whole on refresh, never changed in place).
        partitions = self._partitions
        if topic in partitions and time.monotonic() - self._refreshed_at <= self._ttl_s:
            return partitions[topic]
        asked = time.monotonic()
        with self._lock:
            now = time.monotonic()
            if now - self._refreshed_at > self._ttl_s:
                self._refresh()
            elif topic not in self._partitions and self._refreshed_at < asked:
                found_missing = self._missing.get(topic)
                if found_missing is None or now - found_missing > self._miss_refresh_s:
                    self._refresh()
            if topic not in self._partitions:
                self._missing[topic] = self._refreshed_at
            return self._partitions.get(topic)


class LoginWatch:
    """An AdminClient's ``error_cb`` that keeps the first authentication failure.

    librdkafka reports a refused login (a wrong password, an unknown user) only to the
    client's error callback, and keeps the requests waiting for the broker until they
    time out: a start-up that waits for its topics would report a wrong password only
    after its whole timeout. :func:`ensure_topic` asks this instead, as it waits.
    """

    def __init__(self) -> None:
        self.refused: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        if self.refused is None and error.code() == KafkaError._AUTHENTICATION:
            self.refused = error


def ensure_topic(
    admin: AdminClient,
    name: str,
    partitions: int,
    config: dict[str, Any],
    *,
    login: LoginWatch | None = None,
    timeout_s: float = 30.0,
) -> bool:
    """Create a topic if it does not exist. True if this call created it.

    With `login` (the admin's ``error_cb``), a refused login raises at once; any other
    failure to reach the broker raises once `timeout_s` passed."""
    future = admin.create_topics([NewTopic(name, num_partitions=partitions, config=config)])[name]
    deadline = time.monotonic() + timeout_s
    while login is not None and not future.done() and time.monotonic() < deadline:
        admin.poll(0.1)  # serves the error callback
        if login.refused is not None:
            raise KafkaException(login.refused)
    try:
        future.result(timeout=max(deadline - time.monotonic(), 0))
        return True
    except TimeoutError:  # (concurrent.futures' own since Python 3.11)
        raise TimeoutError(f"no answer from the broker within {timeout_s:g} s") from None
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise
