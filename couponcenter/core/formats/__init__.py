"""Date and time formats for the pages (``FORMAT_MODULE_PATH``): the service works to the second
and in UTC, so every shown moment carries its seconds and its zone's name."""
