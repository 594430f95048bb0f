"""Tests of the DingTalk relay (alertmanager.dingtalk)."""
