"""The status page's static files (HTML, JavaScript, CSS), served by :mod:`cdcflow.core.api.status_page`."""
