"""The one place where the proxy relies on a library's private behaviour.

prometheus_client offers no public API for what is done here; the function says why, and what
exactly it relies on.  ``tests/unit/test_internals.py`` exercises exactly this contract against
the installed prometheus_client (CI runs it at the floor and at the newest release), so a
release that breaks it turns a named test red instead of breaking the proxy at run time.

(The hop used to redirect aiohttp's client reads by switching a ``StreamReader``'s class in
place; the proxy now speaks HTTP/1.1 to the engines itself, :mod:`exporter.proxy.upstream`,
through httptools' public parser API, so no aiohttp private contract is left.)

* :func:`use_multiprocess_values` (prometheus_client): metric values go to the multiprocess
  files.  The documented switch is ``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client
  is first imported; a forked worker inherits the supervisor's already imported module, so
  the value class is replaced instead.  Relied on: ``values.ValueClass`` is read each time a
  metric child is made, and ``values.MultiProcessValue()`` returns such a class.
"""

from __future__ import annotations

__all__ = ["use_multiprocess_values"]


def use_multiprocess_values() -> None:
    """Metric children made from now on keep their values in ``PROMETHEUS_MULTIPROC_DIR``'s
    files (call it before any metric of this process is made)."""
    from prometheus_client import values

    values.ValueClass = values.MultiProcessValue()  # this process's own files (its pid)
