"""Benchmarks of the operations layer (``bench_console``). No production module imports this
package (the import contracts in pyproject.toml), so it may seed data through shortcuts and time
requests with Django's test client."""
