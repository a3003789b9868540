"""Quota admission and what it leaves behind: the QuotaStore interface, its in-process and Redis stores, the live state a subject reads, and the rejection counts."""
