"""mqstore: an embedded, persistent message store."""
