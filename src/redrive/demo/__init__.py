"""`redrive demo` (`make demo`): the items scenario, end to end.

On the embedded default (the local Kafka broker, the embedded PostgreSQL, the retry
service with its web UI), two engines consume the same item events: the items
application on the redrive library (``redrive.App``) and a PySpark Structured
Streaming query built on ``redrive.spark``. An `update-item` event arrives before its
`create-item`; each engine's update fails with "item not found", goes through the
retry service, and is applied once the create has arrived. A malformed event is a
dead letter of each engine, in the one store and web UI.

- :mod:`redrive.demo.scenario`: the run and its narration (:func:`run`);
- :mod:`redrive.demo.items`: the App, its handlers and the items API;
- :mod:`redrive.demo.spark_engine`: the Spark session, query and watcher (driver);
- :mod:`redrive.demo.spark_items`: the Spark handler (runs on Spark's Python workers);
- :mod:`redrive.demo.store`: the item events and store, shared by both engines.

This package's ``__init__`` imports nothing heavy: Spark's Python workers import
:mod:`redrive.demo.spark_items` through it.
"""

from __future__ import annotations


def run(*, oneshot: bool = False) -> int:
    """Run the demo; with ``oneshot``, check the outcome and return 0 if it passed."""
    from redrive.demo.scenario import run as run_scenario

    return run_scenario(oneshot=oneshot)
