"""Adapters that put dsmla under other projects' models (imported on demand)."""
