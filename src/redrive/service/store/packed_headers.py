"""Kafka headers at rest in the retry service's store: packed with MessagePack.

A message's header list is one ``bytea`` value: a MessagePack array of
``[name, value]`` pairs, the name a MessagePack string, the value binary or nil.
Both directions run in msgpack's C code, with no base64 and nothing for PostgreSQL to
parse: the JSON-with-base64 form this replaced cost intake and the scheduler about a
third of their interpreter time (profiled under benchmark 2), and PostgreSQL a jsonb
parse per row. The list comes back byte for byte, in order, duplicates and nil
values included.

Names pass with ``surrogatepass``: confluent-kafka hands over names as Python text,
and a name that is not valid UTF-8 must still be stored and delivered, not stop
intake. Migration 007 converted the rows stored before as JSON into this form in SQL
(tested against this module, byte for byte).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import msgpack

from redrive.headers import Header

_ERRORS = "surrogatepass"
# A packer per thread, reused: building one costs twice what packing a request's
# headers does, and a packer has a buffer of its own, so threads do not share one.
_local = threading.local()


def pack_headers(headers: Sequence[Header]) -> bytes:
    """Headers as stored (see the module docstring)."""
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True, unicode_errors=_ERRORS)
    packed: bytes = packer.pack(headers)
    return packed


def unpack_headers(stored: bytes | memoryview) -> list[Header]:
    """Headers back from their stored form, as confluent-kafka takes them."""
    return list(msgpack.unpackb(stored, use_list=False, raw=False, unicode_errors=_ERRORS))
