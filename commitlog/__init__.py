"""The CommitLog: every topic and queue appends into one log of fixed-size mapped files."""
