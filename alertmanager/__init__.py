"""gpufed alertmanager package."""
