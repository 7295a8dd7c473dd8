"""Coordinator, controller, GC safepoint machinery and changefeed declarations."""
