"""gpufed sharder package."""
