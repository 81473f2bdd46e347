"""The real WSGI app, every answer naming the worker process that served it (``X-Served-By``), so
a test against several gunicorn workers knows which of them it reached."""

import os

from couponcenter.wsgi import application as django_application


def application(environ, start_response):
    def start(status, headers, exc_info=None):
        return start_response(status, [*headers, ("X-Served-By", str(os.getpid()))], exc_info)

    return django_application(environ, start)
