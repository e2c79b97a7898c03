-- Schedules (0009): the tenant API's statements and the dispatcher's.

-- name: database_now
-- The cell's one clock: a new schedule's first occurrence is the first after it.
SELECT now() AS now;

-- name: lock_strict_allowance
-- Serialises the writes that may add an active strict schedule to a tenant
-- (create, update, resume; domain/strict_allowance.py), held to the end of the
-- transaction: the next one's count (strict_in_use, a new snapshot under READ
-- COMMITTED) sees this one's schedule. An advisory lock rather than the
-- tenant row: every claim and every finished job updates that row (the
-- running counter), and they should not wait for a tenant's API call. Its
-- own class ('CPSA'), apart from the move fence's (0006): a strict write
-- takes this one, then the fence's shared one in its insert's trigger, and
-- the freeze never waits for this one, so the two cannot deadlock.
SELECT pg_advisory_xact_lock(1129337665, cellplane_tenant_lock_key(%(tenant_id)s));

-- name: strict_in_use
-- The tenant's allowance and its active strict schedules but the one being
-- written (NULL: a create). Read after lock_strict_allowance. A tenant row
-- from before 0014 has its plan's default.
SELECT coalesce(t.strict_schedules, cellplane_strict_schedules_default(t.plan)) AS allowance,
       (SELECT count(*) FROM schedules s
         WHERE s.tenant_id = t.tenant_id AND s.state = 'active' AND s.dispatch_window_seconds = 0
           AND s.schedule_id IS DISTINCT FROM %(schedule_id)s::uuid) AS in_use
  FROM tenants t
 WHERE t.tenant_id = %(tenant_id)s;

-- name: insert_schedule
-- ON CONFLICT: a create with the same Idempotency-Key made its schedule
-- already (or is making it: the insert waits for that one to commit).
INSERT INTO schedules (schedule_id, tenant_id, kind, cron, run_at, time_zone, target, payload,
                       max_attempts, misfire_policy, max_catch_up_runs, dispatch_window_seconds,
                       dispatch_offset, priority, state, next_at, dispatch_at, create_key,
                       create_hash)
VALUES (%(schedule_id)s, %(tenant_id)s, %(kind)s, %(cron)s, %(run_at)s, %(time_zone)s, %(target)s,
        %(payload)s, %(max_attempts)s, %(misfire_policy)s, %(max_catch_up_runs)s,
        %(dispatch_window_seconds)s, %(dispatch_offset)s, %(priority)s, %(state)s, %(next_at)s,
        %(next_at)s::timestamptz + %(dispatch_offset)s::interval, %(create_key)s, %(create_hash)s)
ON CONFLICT (tenant_id, create_key) WHERE create_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: schedule_by_create_key
SELECT * FROM schedules WHERE tenant_id = %(tenant_id)s AND create_key = %(create_key)s;

-- name: get_schedule
SELECT * FROM schedules WHERE tenant_id = %(tenant_id)s AND schedule_id = %(schedule_id)s;

-- name: lock_schedule
-- Taken before an update reads whether the schedule is busy: once the lock is
-- held, a dispatcher that was turning an occurrence into a job has committed,
-- and the next statement's snapshot sees its job.
SELECT * FROM schedules WHERE tenant_id = %(tenant_id)s AND schedule_id = %(schedule_id)s
   FOR UPDATE;

-- name: schedule_busy
SELECT EXISTS (SELECT 1 FROM jobs WHERE job_id = %(job_id)s AND status IN ('queued', 'running'))
    AS busy;

-- name: list_schedules
-- Keyset pagination, newest first, like list_jobs.
SELECT * FROM schedules
 WHERE tenant_id = %(tenant_id)s
   AND (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(after_created)s::timestamptz IS NULL
        OR (created_at, schedule_id) < (%(after_created)s::timestamptz, %(after_schedule)s::uuid))
 ORDER BY created_at DESC, schedule_id DESC
 LIMIT %(limit)s;

-- name: replace_schedule
-- An update keeps the id (and so the dispatch offset's hash) and the state.
UPDATE schedules
   SET kind = %(kind)s, cron = %(cron)s, run_at = %(run_at)s, time_zone = %(time_zone)s,
       target = %(target)s, payload = %(payload)s, max_attempts = %(max_attempts)s,
       misfire_policy = %(misfire_policy)s, max_catch_up_runs = %(max_catch_up_runs)s,
       dispatch_window_seconds = %(dispatch_window_seconds)s, dispatch_offset = %(dispatch_offset)s,
       priority = %(priority)s,
       state = %(state)s, next_at = %(next_at)s,
       dispatch_at = %(next_at)s::timestamptz + %(dispatch_offset)s::interval, updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND schedule_id = %(schedule_id)s
RETURNING *;

-- name: set_schedule_state
-- Pause, resume and cancel. A resumed schedule keeps its pending occurrence:
-- if that passed while paused, the dispatcher applies the misfire policy.
UPDATE schedules
   SET state = %(state)s,
       next_at = CASE WHEN %(state)s = 'cancelled' THEN NULL ELSE next_at END,
       dispatch_at = CASE WHEN %(state)s = 'cancelled' THEN NULL ELSE dispatch_at END,
       updated_at = now()
 WHERE tenant_id = %(tenant_id)s AND schedule_id = %(schedule_id)s AND state = ANY(%(from)s)
RETURNING *;

-- name: schedule_runs
-- A schedule's run history, newest first: the attempts, outcome and timings
-- are the job's.
SELECT r.scheduled_for, r.idempotency_key, r.dispatched_at, r.job_id, j.status, j.attempts,
       j.started_at, j.finished_at, j.error_code
  FROM schedule_runs r LEFT JOIN jobs j USING (job_id)
 WHERE r.schedule_id = %(schedule_id)s
   AND (%(before)s::timestamptz IS NULL OR r.scheduled_for < %(before)s::timestamptz)
 ORDER BY r.scheduled_for DESC
 LIMIT %(limit)s;

-- name: lock_due_schedules
-- Active schedules whose pending occurrence is due by the database's clock
-- (its scheduled time plus its offset in the window), each locked for the
-- dispatcher that takes it; SKIP LOCKED lets another dispatcher take the
-- next ones instead of waiting. A schedule another dispatcher has just moved
-- on is rechecked against its new dispatch_at when the lock is taken, and
-- passed over. Schedules of tenants that are paused, moving or gone wait.
SELECT s.schedule_id, s.tenant_id, s.kind, s.cron, s.run_at, s.time_zone, s.target, s.payload,
       s.max_attempts, s.misfire_policy, s.max_catch_up_runs, s.dispatch_offset, s.next_at,
       s.priority, now() AS now
  FROM schedules s JOIN tenants t USING (tenant_id)
 WHERE s.state = 'active' AND s.dispatch_at <= now() AND t.state = 'active'
 ORDER BY s.dispatch_at
 LIMIT %(batch)s
   FOR UPDATE OF s SKIP LOCKED;

-- name: insert_runs
-- A whole pass's runs in one statement (one trip, and the fences' statement
-- triggers once, instead of four statements per run: at 10,000 runs due in
-- one second those were most of a strict run's lag). The key (schedule,
-- scheduled time) is the guarantee of one job per occurrence: an occurrence
-- inserted before conflicts and makes no job or event; the answer lists the
-- runs made. Each job is queued now: run_after defaults to now(), at or
-- after the occurrence's dispatch time, itself at or after its scheduled
-- time, in the schedule's priority class. Its event is the API's
-- `job.accepted` (api.sql). Its step is insert_run_steps'.
WITH planned AS (
    SELECT * FROM unnest(%(schedule_ids)s::uuid[], %(scheduled_fors)s::timestamptz[],
                         %(tenant_ids)s::text[], %(job_ids)s::uuid[], %(keys)s::text[],
                         %(targets)s::text[], %(payloads)s::jsonb[], %(max_attempts)s::integer[],
                         %(priorities)s::text[])
        AS p(schedule_id, scheduled_for, tenant_id, job_id, idempotency_key, target, payload,
             max_attempts, priority)
), runs AS (
    INSERT INTO schedule_runs (schedule_id, scheduled_for, tenant_id, job_id, idempotency_key)
    SELECT schedule_id, scheduled_for, tenant_id, job_id, idempotency_key FROM planned
    ON CONFLICT (schedule_id, scheduled_for) DO NOTHING
    RETURNING schedule_id, scheduled_for, job_id, idempotency_key
), made AS (
    SELECT p.* FROM planned p JOIN runs r USING (job_id)
), queued AS (
    INSERT INTO jobs (job_id, tenant_id, status, target, step_count, payload, max_attempts,
                      estimate, priority)
    SELECT job_id, tenant_id, 'queued', target, 1, payload, max_attempts, 0, priority FROM made
), events AS (
    INSERT INTO outbox (event_id, tenant_id, job_id, kind, payload)
    SELECT gen_random_uuid(), tenant_id, job_id, 'job.accepted',
           jsonb_build_object('job_id', job_id::text, 'status', 'queued')
      FROM made
)
SELECT schedule_id, scheduled_for, job_id, idempotency_key FROM runs;

-- name: insert_run_steps
-- The one step of each job insert_runs made, carrying the run's key: the
-- same on every try of this run, it is what the target sees. A statement of
-- its own, after the jobs': the steps' move fence (0006) finds their tenant
-- through `jobs`, and a trigger of the statement that inserts the jobs does
-- not see them yet (the move would miss the steps' changes).
INSERT INTO job_steps (job_id, step, idempotency_key, status)
SELECT job_id, 1, idempotency_key, 'pending'
  FROM unnest(%(job_ids)s::uuid[], %(keys)s::text[]) AS s(job_id, idempotency_key);

-- name: advance_schedules
-- Each schedule of the pass to its next occurrence, conditional on the
-- occurrence the dispatcher planned from, so a plan made from a stale read
-- changes nothing. No next occurrence: the schedule is done.
UPDATE schedules s
   SET next_at = a.next_at,
       dispatch_at = a.next_at + s.dispatch_offset,
       state = CASE WHEN a.next_at IS NULL THEN 'completed' ELSE s.state END,
       last_job_id = coalesce(a.last_job_id, s.last_job_id),
       updated_at = now()
  FROM unnest(%(schedule_ids)s::uuid[], %(next_ats)s::timestamptz[], %(last_job_ids)s::uuid[],
              %(planned_froms)s::timestamptz[]) AS a(schedule_id, next_at, last_job_id, planned_from)
 WHERE s.schedule_id = a.schedule_id AND s.next_at = a.planned_from
RETURNING s.schedule_id;

-- name: prune_schedule_runs
-- Run history is kept for a retention; the jobs themselves are not touched.
-- Not the runs of a tenant frozen for a move or moved out: the fence (0006)
-- would refuse the whole statement, every tenant's pruning with it. A move's
-- capture sends the source's prunings as deletes (0013); a moved-out copy
-- goes whole with its purge.
DELETE FROM schedule_runs r
 WHERE r.dispatched_at < now() - make_interval(days => %(days)s)
   AND r.tenant_id NOT IN (SELECT t.tenant_id FROM tenants t WHERE t.state IN ('frozen', 'moved'));
