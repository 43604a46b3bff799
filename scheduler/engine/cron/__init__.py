"""Cron in the leader: the catalog of jobs, the firing loop, the messages, the cursors."""
