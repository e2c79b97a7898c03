-- The webhook relay: fan-out of outbox events to deliveries, claims of due
-- deliveries under each endpoint's cap, outcomes, and the reaper of leases a
-- dead relay left behind. Postgres' own now() is the one clock, for leases,
-- backoff and the breakers' cool-downs alike.
--
-- Endpoint rows are locked FOR NO KEY UPDATE, never FOR UPDATE: fan-out's
-- inserts into `deliveries` take a KEY SHARE lock on the endpoint through the
-- foreign key, and FOR UPDATE would make them wait behind every claim.

-- name: fan_out_events
-- Each unrelayed event gets one pending delivery per endpoint of its tenant,
-- and is marked relayed, in one statement. SKIP LOCKED: concurrent relays
-- take different events. ON CONFLICT: an event whose relayed_at was reset by
-- hand (to reach an endpoint added since) gets only the deliveries it lacks.
-- An event of a tenant without endpoints is marked relayed with none.
-- Events of a tenant cutting over or moved out wait (0006's fence would
-- refuse the whole batch for them): the move carries them unrelayed.
WITH events AS (
    SELECT event_id, tenant_id FROM outbox
     WHERE relayed_at IS NULL
       AND tenant_id NOT IN (SELECT tenant_id FROM tenants WHERE state IN ('frozen', 'moved'))
     ORDER BY created_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), fanned AS (
    INSERT INTO deliveries (event_id, endpoint_id, status, next_attempt_at)
    SELECT e.event_id, w.endpoint_id, 'pending', now()
      FROM events e JOIN webhook_endpoints w ON w.tenant_id = e.tenant_id
    ON CONFLICT (event_id, endpoint_id) DO NOTHING
    RETURNING event_id
), relayed AS (
    UPDATE outbox o SET relayed_at = now()
      FROM events e
     WHERE o.event_id = e.event_id
    RETURNING o.event_id
)
SELECT (SELECT count(*) FROM relayed)::int AS events, (SELECT count(*) FROM fanned)::int AS deliveries;

-- name: lock_due_endpoints
-- First statement of a claim: the endpoints with due deliveries, those waited
-- on longest first, each locked so that one relay at a time claims for it
-- (SKIP LOCKED: another relay takes other endpoints meanwhile). Endpoints
-- whose breaker is open and cooling down are left out here only so they do
-- not use up the batch; the breaker module would give them no slots anyway.
SELECT w.endpoint_id
  FROM webhook_endpoints w
 CROSS JOIN LATERAL (
       SELECT min(d.next_attempt_at) AS oldest FROM deliveries d
        WHERE d.endpoint_id = w.endpoint_id AND d.status = 'pending'
          AND d.leased_until IS NULL AND d.next_attempt_at <= now()) due
 WHERE due.oldest IS NOT NULL
   AND (w.breaker <> 'open' OR w.open_until <= now())
   -- Not for a tenant cutting over or moved out (the fence, 0006).
   AND w.tenant_id NOT IN (SELECT tenant_id FROM tenants WHERE state IN ('frozen', 'moved'))
 ORDER BY due.oldest, w.endpoint_id
 LIMIT %(batch)s
   FOR NO KEY UPDATE OF w SKIP LOCKED;

-- name: endpoint_loads
-- Second statement of a claim, after the locks are held. It is a statement
-- of its own on purpose: its snapshot is taken after the locks were granted,
-- so it sees the leases of every claim that held a lock before us. Read in
-- the locking statement's snapshot, a claim that committed while we waited
-- for its lock would be missing from the count, and the cap could be
-- exceeded. Leases that ran out count until the reaper has recorded them:
-- erring towards fewer requests, never more.
SELECT w.endpoint_id, w.url, w.secret, w.max_concurrency, w.breaker, w.failures, w.open_until,
       w.ramp_allowance, now() AS now,
       (SELECT count(*) FROM deliveries f
         WHERE f.endpoint_id = w.endpoint_id AND f.leased_until IS NOT NULL)::int AS in_flight
  FROM webhook_endpoints w
 WHERE w.endpoint_id = ANY(%(endpoint_ids)s::bigint[]);

-- name: claim_deliveries
-- Third statement of a claim: up to `slots` of each endpoint's due
-- deliveries, oldest first, each leased for the request's timeout plus a
-- margin and its attempt counted now, so an attempt whose relay dies is still
-- an attempt. Its attempt row is written as in_flight.
WITH wanted AS (
    SELECT endpoint_id, slots
      FROM unnest(%(endpoint_ids)s::bigint[], %(slots)s::int[]) AS w(endpoint_id, slots)
), picked AS (
    SELECT d.event_id, d.endpoint_id
      FROM wanted
     CROSS JOIN LATERAL (
           SELECT q.event_id, q.endpoint_id FROM deliveries q
            WHERE q.endpoint_id = wanted.endpoint_id AND q.status = 'pending'
              AND q.leased_until IS NULL AND q.next_attempt_at <= now()
            ORDER BY q.next_attempt_at, q.event_id
            LIMIT wanted.slots
              FOR UPDATE SKIP LOCKED) d
), leased AS (
    UPDATE deliveries d
       SET attempts = d.attempts + 1,
           leased_until = now() + make_interval(secs => %(lease_seconds)s),
           leased_by = %(relay)s
      FROM picked
     WHERE d.event_id = picked.event_id AND d.endpoint_id = picked.endpoint_id
    RETURNING d.event_id, d.endpoint_id, d.attempts
), attempt AS (
    INSERT INTO delivery_attempts (event_id, endpoint_id, attempt, relay, outcome)
    SELECT event_id, endpoint_id, attempts, %(relay)s, 'in_flight' FROM leased
)
SELECT l.event_id, l.endpoint_id, l.attempts AS attempt, o.tenant_id, o.job_id, o.kind,
       o.payload, o.created_at
  FROM leased l JOIN outbox o ON o.event_id = l.event_id;

-- name: lock_endpoint
-- Before an outcome is recorded: the endpoint's breaker, locked (waiting, this
-- time: the outcome must be counted) so that concurrent outcomes apply one
-- after the other.
SELECT endpoint_id, max_concurrency, breaker, failures, open_until, ramp_allowance, now() AS now
  FROM webhook_endpoints
 WHERE endpoint_id = %(endpoint_id)s
   FOR NO KEY UPDATE;

-- name: finish_delivery
-- An attempt's outcome, recorded only while the lease is still this
-- attempt's: if the reaper took it back (and perhaps another relay has
-- claimed it again), the delivery is left alone and only the attempt's own
-- row learns what really happened.
WITH finished AS (
    UPDATE deliveries d
       SET status = %(status)s,
           next_attempt_at = CASE WHEN %(status)s = 'pending'
                                  THEN now() + make_interval(secs => %(delay_seconds)s)
                                  ELSE d.next_attempt_at END,
           last_status_code = %(status_code)s,
           last_error = %(error)s,
           delivered_at = CASE WHEN %(status)s = 'delivered' THEN now() END,
           leased_until = NULL, leased_by = NULL
     WHERE d.event_id = %(event_id)s AND d.endpoint_id = %(endpoint_id)s
       AND d.attempts = %(attempt)s AND d.status = 'pending' AND d.leased_until IS NOT NULL
    RETURNING d.status
), recorded AS (
    UPDATE delivery_attempts a
       SET outcome = %(outcome)s, status_code = %(status_code)s, error = %(error)s,
           finished_at = now()
     WHERE a.event_id = %(event_id)s AND a.endpoint_id = %(endpoint_id)s
       AND a.attempt = %(attempt)s
)
SELECT status FROM finished;

-- name: save_breaker
UPDATE webhook_endpoints
   SET breaker = %(state)s, failures = %(failures)s, open_until = %(open_until)s,
       ramp_allowance = %(allowance)s
 WHERE endpoint_id = %(endpoint_id)s;

-- name: reap_lost_deliveries
-- Leases that ran out: their relay died or stalled past the request's
-- timeout. The attempt is recorded as lost and the delivery is due again at
-- once (dead if that was its last attempt). The request may well have
-- reached the receiver: this is where at-least-once delivers twice, and why
-- every delivery carries its event's stable id.
-- Leases of a tenant cutting over or moved out stay until it is writable
-- again (the fence, 0006); a moved tenant's go with its purge.
WITH lost AS (
    SELECT event_id, endpoint_id FROM deliveries
     WHERE leased_until < now()
       AND endpoint_id NOT IN (SELECT w.endpoint_id FROM webhook_endpoints w
                                JOIN tenants t USING (tenant_id)
                               WHERE t.state IN ('frozen', 'moved'))
     ORDER BY leased_until
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
), released AS (
    UPDATE deliveries d
       SET status = CASE WHEN d.attempts >= %(max_attempts)s THEN 'dead' ELSE 'pending' END,
           leased_until = NULL, leased_by = NULL, next_attempt_at = now(),
           last_status_code = NULL,
           last_error = 'the relay holding this delivery never reported its outcome'
      FROM lost
     WHERE d.event_id = lost.event_id AND d.endpoint_id = lost.endpoint_id
    RETURNING d.event_id, d.endpoint_id, d.attempts, d.status
), recorded AS (
    UPDATE delivery_attempts a
       SET outcome = 'lost', finished_at = now(),
           error = 'the relay holding this delivery never reported its outcome'
      FROM released r
     WHERE a.event_id = r.event_id AND a.endpoint_id = r.endpoint_id AND a.attempt = r.attempts
       AND a.outcome = 'in_flight'
)
SELECT event_id, endpoint_id, status FROM released;
