"""Running servers and processes on this machine: loopback ports and HTTP servers, polling
until something holds, a process tree's CPU and memory, and a local DingTalk (``dingtalk``:
the robot API the demo's group, the tests, the benches and the compose runner post to).

``gpufed demo`` starts its stack with these, and the benches, harnesses and tests start
theirs with the same pieces, so none of them imports the demo for its plumbing. No service
code imports this package (``.importlinter``: ``localrun-not-in-service``).
"""
