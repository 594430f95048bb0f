"""gpufed thanos package."""
