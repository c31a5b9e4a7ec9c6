"""Custom op libraries used by the tests (each module is one library)."""
