"""The operator console served at `/ui/` (see `scheduler.console.console` and docs/console.md)."""
