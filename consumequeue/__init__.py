"""consumequeue package."""
