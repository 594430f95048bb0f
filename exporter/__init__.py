"""gpufed exporter package."""
