// Command producer publishes three delayed tasks to mq-scheduler's delay lane, then cancels
// one, reschedules another and prints the daemon's answers (examples/README.md).
//
// Build offline with Debian's packages, from this directory:
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o producer .
//
// Run with NATS_URL set (default nats://127.0.0.1:4222); TARGET (default mq.tasks.go) names
// the subject the tasks are delivered to.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// region envelope

// Envelope is a hanzo.mq.v1 task envelope (docs/producers.md, "The envelope").
type Envelope struct {
	Schema     string         `json:"schema"`
	ID         string         `json:"id"`
	Type       string         `json:"type"`
	Source     string         `json:"source"`
	Timestamp  string         `json:"timestamp"`
	Priority   int            `json:"priority,omitempty"`
	DelayUntil string         `json:"delay_until,omitempty"`
	TTLSeconds int            `json:"ttl_seconds,omitempty"`
	Data       map[string]any `json:"data"`
}

func newEnvelope(due time.Time, data map[string]any) Envelope {
	now := time.Now().UTC()
	return Envelope{
		Schema:     "hanzo.mq.v1",
		ID:         newID(),
		Type:       "example.go",
		Source:     "go-producer",
		Timestamp:  now.Format(time.RFC3339Nano),
		DelayUntil: due.UTC().Format(time.RFC3339Nano), // with Z: naive times are refused
		Data:       data,
	}
}

// newID is a random id; use a ULID library where you have one.
func newID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		log.Fatal(err)
	}
	return "go-" + hex.EncodeToString(b)
}

// endregion envelope

// region publish

// publishDelayed publishes env to the delay lane of target (mq.tasks.go -> mq.delay.tasks.go),
// with the envelope id as Nats-Msg-Id.
func publishDelayed(js nats.JetStreamContext, target string, env Envelope) error {
	body, err := json.Marshal(env)
	if err != nil {
		return err
	}
	lane := "mq.delay." + strings.TrimPrefix(target, "mq.")
	ack, err := js.Publish(lane, body, nats.MsgId(env.ID))
	if err != nil {
		return fmt.Errorf("publish %s: %w", env.ID, err)
	}
	if ack.Duplicate {
		// Not stored: another message had this Nats-Msg-Id within the lane's duplicate
		// window. Without the header the daemon's own id rule decides.
		if _, err = js.Publish(lane, body); err != nil {
			return fmt.Errorf("publish %s again: %w", env.ID, err)
		}
	}
	fmt.Printf("published %s to %s due %s\n", env.ID, lane, env.DelayUntil)
	return nil
}

// endregion publish

// region verbs

// verb sends one request to the daemon's request-reply API: scheduler.v1.<verb>.<rest> for
// target mq.<rest> (scheduler.v1.stats without a target). It prints the reply and returns it
// decoded; an {"error": {"code", "message"}} reply is returned as an error.
func verb(nc *nats.Conn, name, target string, body any) (map[string]any, error) {
	subject := "scheduler.v1." + name
	if target != "" {
		subject += "." + strings.TrimPrefix(target, "mq.")
	}
	raw := []byte{}
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	msg, err := nc.Request(subject, raw, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", subject, err)
	}
	var reply map[string]any
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, fmt.Errorf("%s: %w", subject, err)
	}
	if failure, failed := reply["error"]; failed {
		return nil, fmt.Errorf("%s: %v", subject, failure)
	}
	fmt.Printf("%s %s\n", name, msg.Data)
	return reply, nil
}

// waitStored polls get until the daemon has taken the task off the lane into PostgreSQL.
// (A cancel or reschedule needs no wait: one that arrives first is kept as an intent.)
func waitStored(nc *nats.Conn, target, id string) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		reply, err := verb(nc, "get", target, map[string]string{"id": id})
		if err != nil {
			return err
		}
		if reply["status"] == "found" {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s: not stored within 10 s", id)
}

// endregion verbs

// region main

func main() {
	url := envOr("NATS_URL", nats.DefaultURL)
	target := envOr("TARGET", "mq.tasks.go")
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		log.Fatal(err)
	}

	now := time.Now()
	soon := newEnvelope(now.Add(time.Second), map[string]any{"step": "delivered"})
	dropped := newEnvelope(now.Add(3*time.Second), map[string]any{"step": "cancelled"})
	moved := newEnvelope(now.Add(time.Hour), map[string]any{"step": "rescheduled"})
	for _, env := range []Envelope{soon, dropped, moved} {
		if err := publishDelayed(js, target, env); err != nil {
			log.Fatal(err)
		}
	}
	if err := waitStored(nc, target, moved.ID); err != nil {
		log.Fatal(err)
	}
	expect("cancelled")(verb(nc, "cancel", target, map[string]string{"id": dropped.ID}))
	due := now.Add(3 * time.Second).UTC().Format(time.RFC3339Nano) // an hour earlier
	expect("rescheduled")(verb(nc, "reschedule", target, map[string]string{"id": moved.ID, "delay_until": due}))
	expect("found")(verb(nc, "get", target, map[string]string{"id": moved.ID}))
	expect("")(verb(nc, "stats", "", nil))
}

// expect stops the program unless a verb's reply carries this status ("": any reply).
func expect(status string) func(map[string]any, error) {
	return func(reply map[string]any, err error) {
		if err != nil {
			log.Fatal(err)
		}
		if status != "" && reply["status"] != status {
			log.Fatalf("expected %q, got %v", status, reply)
		}
	}
}

func envOr(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

// endregion main
