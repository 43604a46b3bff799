"""The `scheduler` command line: the daemon's verbs (`main`) and the operator's verbs over the
management API (ops, authoring, activity), with one output style (`render`)."""
