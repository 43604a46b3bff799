"""The leader's engine: delayed delivery (`engine.delayed`) and cron (`engine.cron`), wired by
`leader_loop`, speaking to NATS and PostgreSQL only through `ports` and to leadership through
`office`."""
