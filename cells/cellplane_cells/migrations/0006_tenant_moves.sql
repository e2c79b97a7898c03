-- 0006: online tenant moves: a per-tenant write fence and change capture.
--
-- A tenant moves to another cell while this one keeps serving it: its rows
-- are copied page by page, then what changed meanwhile, in rounds, then the
-- tenant is frozen here for a short cutover. Two things make that safe, and
-- both live in the database so that no code path (a worker SIGSTOP'd holding
-- a claim, a relay, an admin call) can go around them:
--
-- * The fence. A write touching rows of a tenant whose state is 'frozen'
--   (cutting over) or 'moved' (moved out, its rows kept read-only until the
--   purge) is refused with SQLSTATE CPT01, unless the transaction declared
--   itself the move's own admin path: set_config('cellplane.tenant_admin',
--   'on', true).
-- * Change capture. While `capturing` is on, every write of the tenant's
--   rows appends (tenant, kind, key) to tenant_changes; the move re-sends the
--   current version of each changed row.
--
-- Race-freedom. The check runs in an AFTER ... FOR EACH STATEMENT trigger,
-- which first takes a shared advisory lock per tenant of the statement
-- (held to the end of the transaction) and only then reads the tenant's
-- state, in a fresh snapshot (READ COMMITTED: each statement of the plpgsql
-- function takes one). The freeze, and the switch that turns capture on,
-- take the exclusive lock on the same key before they change the tenant row.
-- So a writer that passed the check holds its shared lock until it commits,
-- and the freeze waits for it: no write that passed before the freeze lands
-- after it, and none escapes capture. The lock order is the tenant row first
-- (claims lock it FOR UPDATE in the statement that fires the trigger), then
-- the advisory lock; the freeze locks the row FOR NO KEY UPDATE first too,
-- which does not conflict with the KEY SHARE lock that inserts of a writer
-- holding the shared advisory lock take through their foreign key.
--
-- The `tenants` table itself is not fenced: the operator's quota updates and
-- the claims' counters write it, and a claim writes it only together with
-- fenced `jobs` rows. delivery_attempts is not fenced either: it is the
-- relay's log, not state that moves, and every write to it is in a
-- statement that also writes the fenced `deliveries`.

ALTER TABLE tenants
    DROP CONSTRAINT tenants_state_check,
    ADD CONSTRAINT tenants_state_check
        CHECK (state IN ('active', 'paused', 'frozen', 'retired', 'moved')),
    ADD COLUMN move_id text,
    ADD COLUMN capturing boolean NOT NULL DEFAULT false,
    ADD COLUMN purge_after timestamptz;

CREATE TABLE tenant_changes (
    seq        bigserial PRIMARY KEY,
    tenant_id  text NOT NULL,
    kind       text NOT NULL,
    key        text NOT NULL
);
CREATE INDEX tenant_changes_by_tenant ON tenant_changes (tenant_id, seq);

-- A move pages through the tenant's undelivered events, and a purge deletes
-- its events: both by tenant.
CREATE INDEX outbox_by_tenant ON outbox (tenant_id, event_id);

-- The advisory lock key of a tenant: a fixed class and the id's hash. Two
-- tenants with the same hash only wait for each other's freeze.
CREATE FUNCTION cellplane_tenant_lock_key(tenant text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashtext(tenant) $$;

-- The check for the tenants of one statement; answers those whose changes
-- are captured (NULL when none, the common case).
CREATE FUNCTION cellplane_tenant_gate(touched text[]) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    tenant text;
    current_state text;
    current_epoch bigint;
    is_capturing boolean;
    captured text[];
BEGIN
    FOREACH tenant IN ARRAY touched LOOP
        PERFORM pg_advisory_xact_lock_shared(1129339988, cellplane_tenant_lock_key(tenant));
        IF current_setting('transaction_isolation') = 'read committed' THEN
            SELECT t.state, t.epoch, t.capturing INTO current_state, current_epoch, is_capturing
              FROM tenants t WHERE t.tenant_id = tenant;
        ELSE
            -- A snapshot older than a freeze would not see it; the row lock
            -- fails such a transaction (serialization failure) instead.
            SELECT t.state, t.epoch, t.capturing INTO current_state, current_epoch, is_capturing
              FROM tenants t WHERE t.tenant_id = tenant FOR SHARE;
        END IF;
        IF current_state IN ('frozen', 'moved')
           AND coalesce(current_setting('cellplane.tenant_admin', true), '') <> 'on' THEN
            RAISE EXCEPTION 'tenant % is % under tenant epoch %: its rows here take no writes',
                tenant, current_state, current_epoch
                USING ERRCODE = 'CPT01';
        END IF;
        IF is_capturing THEN
            captured := array_append(captured, tenant);
        END IF;
    END LOOP;
    RETURN captured;
END
$$;

-- One function for every fenced table: plpgsql plans each branch for the
-- table whose trigger runs it, and `changed` is the statement's transition
-- table (new rows for INSERT and UPDATE, old rows for DELETE).
CREATE FUNCTION cellplane_tenant_fence() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    captured text[];
BEGIN
    CASE TG_TABLE_NAME
    WHEN 'jobs' THEN
        captured := cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT DISTINCT c.tenant_id, 'jobs', c.job_id::text FROM changed c
             WHERE c.tenant_id = ANY(captured);
        END IF;
    WHEN 'job_steps' THEN
        captured := cellplane_tenant_gate(ARRAY(
            SELECT DISTINCT j.tenant_id FROM jobs j
             WHERE j.job_id IN (SELECT c.job_id FROM changed c)));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT DISTINCT j.tenant_id, 'steps', j.job_id::text FROM jobs j
             WHERE j.job_id IN (SELECT c.job_id FROM changed c) AND j.tenant_id = ANY(captured);
        END IF;
    WHEN 'ledger' THEN
        captured := cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT DISTINCT c.tenant_id, 'ledger', c.job_id::text FROM changed c
             WHERE c.tenant_id = ANY(captured);
        END IF;
    WHEN 'wallets' THEN
        captured := cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT unnest(captured), 'wallet', unnest(captured);
        END IF;
    WHEN 'rate_buckets' THEN
        captured := cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT unnest(captured), 'rate_bucket', unnest(captured);
        END IF;
    WHEN 'idempotency_keys' THEN
        captured := cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT DISTINCT c.tenant_id, 'idempotency_keys', c.key FROM changed c
             WHERE c.tenant_id = ANY(captured);
        END IF;
    WHEN 'outbox' THEN
        captured := cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT DISTINCT c.tenant_id, 'outbox', c.event_id::text FROM changed c
             WHERE c.tenant_id = ANY(captured);
        END IF;
    WHEN 'deliveries' THEN
        -- "Undelivered" depends on the deliveries: their changes are the event's.
        captured := cellplane_tenant_gate(ARRAY(
            SELECT DISTINCT o.tenant_id FROM outbox o
             WHERE o.event_id IN (SELECT c.event_id FROM changed c)));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT DISTINCT o.tenant_id, 'outbox', o.event_id::text FROM outbox o
             WHERE o.event_id IN (SELECT c.event_id FROM changed c) AND o.tenant_id = ANY(captured);
        END IF;
    WHEN 'targets' THEN
        captured := cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT DISTINCT c.tenant_id, 'targets', c.name FROM changed c
             WHERE c.tenant_id = ANY(captured);
        END IF;
    WHEN 'webhook_endpoints' THEN
        captured := cellplane_tenant_gate(ARRAY(SELECT DISTINCT c.tenant_id FROM changed c));
        IF captured IS NOT NULL THEN
            INSERT INTO tenant_changes (tenant_id, kind, key)
            SELECT DISTINCT c.tenant_id, 'webhooks', c.url FROM changed c
             WHERE c.tenant_id = ANY(captured);
        END IF;
    END CASE;
    RETURN NULL;
END
$$;

-- Transition tables allow one event per trigger: three triggers per table.
-- UPDATE keeps only the new rows (no key column of these tables changes).
DO $$
DECLARE
    fenced text;
BEGIN
    FOREACH fenced IN ARRAY ARRAY['rate_buckets', 'wallets', 'targets', 'webhook_endpoints',
        'jobs', 'job_steps', 'ledger', 'idempotency_keys', 'outbox', 'deliveries']
    LOOP
        EXECUTE format('CREATE TRIGGER cellplane_tenant_fence_insert AFTER INSERT ON %I '
                       'REFERENCING NEW TABLE AS changed FOR EACH STATEMENT '
                       'EXECUTE FUNCTION cellplane_tenant_fence()', fenced);
        EXECUTE format('CREATE TRIGGER cellplane_tenant_fence_update AFTER UPDATE ON %I '
                       'REFERENCING NEW TABLE AS changed FOR EACH STATEMENT '
                       'EXECUTE FUNCTION cellplane_tenant_fence()', fenced);
        EXECUTE format('CREATE TRIGGER cellplane_tenant_fence_delete AFTER DELETE ON %I '
                       'REFERENCING OLD TABLE AS changed FOR EACH STATEMENT '
                       'EXECUTE FUNCTION cellplane_tenant_fence()', fenced);
    END LOOP;
END
$$;

-- The tenant row's own changes that a move carries (plan, quotas, key,
-- signing secret), captured by a row trigger whose WHEN clause is evaluated
-- without calling any function: the claims' counter updates cost nothing.
CREATE FUNCTION cellplane_capture_tenant_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_changes (tenant_id, kind, key) VALUES (NEW.tenant_id, 'tenant', NEW.tenant_id);
    RETURN NULL;
END
$$;

CREATE TRIGGER cellplane_capture_tenant_row AFTER UPDATE ON tenants FOR EACH ROW
    WHEN (NEW.capturing AND (OLD.plan, OLD.max_running, OLD.jobs_per_second, OLD.burst,
                             OLD.daily_spend_limit, OLD.api_key_hash, OLD.signing_secret)
                            IS DISTINCT FROM
                            (NEW.plan, NEW.max_running, NEW.jobs_per_second, NEW.burst,
                             NEW.daily_spend_limit, NEW.api_key_hash, NEW.signing_secret))
    EXECUTE FUNCTION cellplane_capture_tenant_row();
