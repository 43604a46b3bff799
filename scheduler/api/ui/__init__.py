"""The operator console served at `/ui/` (see `scheduler.api.ui.console` and docs/console.md)."""
