"""`python -m alertmanager.dingtalk`: the same entry point as the `gpufed-dingtalk` script."""

from alertmanager.dingtalk.cli import main

main()
