"""indexfile package."""
