"""The daemon process: lifecycle, embedded mode, listeners, start-up checks, upkeep, migrations."""
