-- Schedules (0009): the tenant API's statements and the dispatcher's.

-- name: database_now
-- The cell's one clock: a new schedule's first occurrence is the first after it.
SELECT now() AS now;

-- name: insert_schedule
INSERT INTO schedules (schedule_id, tenant_id, kind, cron, run_at, time_zone, target, payload,
                       max_attempts, misfire_policy, max_catch_up_runs, dispatch_window_seconds,
                       dispatch_offset, state, next_at, dispatch_at)
VALUES (%(schedule_id)s, %(tenant_id)s, %(kind)s, %(cron)s, %(run_at)s, %(time_zone)s, %(target)s,
        %(payload)s, %(max_attempts)s, %(misfire_policy)s, %(max_catch_up_runs)s,
        %(dispatch_window_seconds)s, %(dispatch_offset)s, %(state)s, %(next_at)s,
        %(next_at)s::timestamptz + %(dispatch_offset)s::interval)
RETURNING *;

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
