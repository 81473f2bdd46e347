"""Benchmarks of the operations layer: the whole suite in one sitting (``bench_all``: ``suite``
runs it, ``report`` reads its results) and the console's pages (``bench_console``). No production
module imports this package (the import contracts in pyproject.toml), so it may seed data through
shortcuts and time requests with Django's test client."""
