"""Compatibility: topic metadata and creation moved to :mod:`redrive.topic_admin`.

Kept only while ``redrive.demo`` imports ``ensure_topic`` from here (issue 15); import
from :mod:`redrive.topic_admin` instead.
"""

from __future__ import annotations

from redrive.topic_admin import MetadataUnavailable, TopicMetadata, ensure_topic

__all__ = ["MetadataUnavailable", "TopicMetadata", "ensure_topic"]
