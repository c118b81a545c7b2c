"""Which processes are the deployment's: membership (uid, cgroup, recorded launches with start time and
boot id), the cgroup reconcile creates and owns, and who holds a listening socket. docs/security.md.
"""
