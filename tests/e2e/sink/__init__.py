"""An HTTP sink for the e2e test, run in a container of the project image.

``python3 -m sink`` (from the folder above this one, mounted read-only into the
container) listens on ``0.0.0.0:$SINK_PORT`` (default 8080), answers every request
``200 ok``, and prints one JSON line per request to stdout: the test reads them back
with ``docker logs``. Only the standard library is used.
"""
