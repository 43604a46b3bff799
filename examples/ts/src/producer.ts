// Publishes three delayed tasks to mq-scheduler's delay lane, then cancels one, reschedules
// another and prints the daemon's answers (examples/README.md).
//
//   npm ci && npm run build && NATS_URL=nats://127.0.0.1:4222 npm start
//
// TARGET (default mq.tasks.ts) names the subject the tasks are delivered to.
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";

import { jetstream, type JetStreamClient } from "@nats-io/jetstream";
import { connect, type NatsConnection } from "@nats-io/transport-node";

// region envelope
/** A hanzo.mq.v1 task envelope (docs/producers.md, "The envelope"). */
interface Envelope {
  schema: "hanzo.mq.v1";
  id: string;
  type: string;
  source: string;
  timestamp: string;
  priority?: number;
  delay_until?: string;
  ttl_seconds?: number;
  data: Record<string, unknown>;
}

function envelope(due: Date, data: Record<string, unknown>): Envelope {
  return {
    schema: "hanzo.mq.v1",
    id: `ts-${randomUUID()}`, // use a ULID library where you have one
    type: "example.ts",
    source: "ts-producer",
    timestamp: new Date().toISOString(),
    delay_until: due.toISOString(), // with Z: naive times are refused
    data,
  };
}
// endregion envelope

// region publish
/** Publish `env` to the delay lane of `target` (mq.tasks.ts -> mq.delay.tasks.ts), with the
 * envelope id as Nats-Msg-Id. */
async function publishDelayed(js: JetStreamClient, target: string, env: Envelope): Promise<void> {
  const lane = `mq.delay.${target.replace(/^mq\./, "")}`;
  const body = JSON.stringify(env);
  const ack = await js.publish(lane, body, { msgID: env.id });
  if (ack.duplicate) {
    // Not stored: another message had this Nats-Msg-Id within the lane's duplicate window.
    // Without the header the daemon's own id rule decides.
    await js.publish(lane, body);
  }
  console.log(`published ${env.id} to ${lane} due ${env.delay_until}`);
}
// endregion publish

// region verbs
type Reply = { status?: string; error?: { code: string; message: string } } & Record<string, unknown>;

/** One request to the daemon's request-reply API: scheduler.v1.<verb>.<rest> for target
 * mq.<rest> (scheduler.v1.stats without a target). Prints the reply and returns it decoded;
 * an {"error": {"code", "message"}} reply is thrown. */
async function verb(nc: NatsConnection, name: string, target: string, body?: object): Promise<Reply> {
  const subject = `scheduler.v1.${name}` + (target ? `.${target.replace(/^mq\./, "")}` : "");
  const msg = await nc.request(subject, body === undefined ? "" : JSON.stringify(body), {
    timeout: 5000,
  });
  const reply = msg.json<Reply>();
  if (reply.error) {
    throw new Error(`${subject}: ${reply.error.code}: ${reply.error.message}`);
  }
  console.log(`${name} ${msg.string()}`);
  return reply;
}

/** Poll get until the daemon has taken the task off the lane into PostgreSQL. (A cancel or
 * reschedule needs no wait: one that arrives first is kept as an intent.) */
async function waitStored(nc: NatsConnection, target: string, id: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (Date.now() < deadline) {
    if ((await verb(nc, "get", target, { id })).status === "found") {
      return;
    }
    await sleep(100);
  }
  throw new Error(`${id}: not stored within 10 s`);
}

function expect(status: string, reply: Reply): void {
  if (reply.status !== status) {
    throw new Error(`expected ${status}, got ${JSON.stringify(reply)}`);
  }
}
// endregion verbs

// region main
async function main(): Promise<void> {
  const target = process.env.TARGET || "mq.tasks.ts";
  const nc = await connect({ servers: process.env.NATS_URL || "nats://127.0.0.1:4222" });
  try {
    const js = jetstream(nc);
    const now = Date.now();
    const soon = envelope(new Date(now + 1_000), { step: "delivered" });
    const dropped = envelope(new Date(now + 3_000), { step: "cancelled" });
    const moved = envelope(new Date(now + 3_600_000), { step: "rescheduled" });
    for (const env of [soon, dropped, moved]) {
      await publishDelayed(js, target, env);
    }
    await waitStored(nc, target, moved.id);
    expect("cancelled", await verb(nc, "cancel", target, { id: dropped.id }));
    const due = new Date(now + 3_000).toISOString(); // an hour earlier
    expect("rescheduled", await verb(nc, "reschedule", target, { id: moved.id, delay_until: due }));
    expect("found", await verb(nc, "get", target, { id: moved.id }));
    await verb(nc, "stats", "");
  } finally {
    await nc.drain();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
// endregion main
