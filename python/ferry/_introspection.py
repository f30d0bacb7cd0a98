"""ferry.snapshot: this process's channel ends, listeners, fan-outs, workers and shared
memory, as `ferry show --json` shows them (schema: docs/design/introspection.md)."""

import json

from . import _ferry

__all__ = ["disable_introspection", "enable_introspection", "introspection_enabled", "snapshot"]

enable_introspection = _ferry.enable_introspection
disable_introspection = _ferry.disable_introspection
introspection_enabled = _ferry.introspection_enabled


def snapshot():
    """This process's figures now, as a dict (schema version 1): ``ends`` (one per channel
    end: ``label``, ``transport``, ``direction``, ``messages``, ``bytes``, ``blocked_ns`` ...),
    ``listeners``, ``shared_memory``, ``cuda``, ``workers`` and ``fanouts``. Works whether
    introspection is on or off; blocked time and last activity are measured only while it is on.
    """
    return json.loads(_ferry._snapshot_json())
