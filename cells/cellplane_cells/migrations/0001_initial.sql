-- 0001: the cell's tables. Money is in micro-credits (bigint), never floats.

-- The placement group this database belongs to: one row. The owner of the
-- group's lease writes its epoch and how long it may still act; the database
-- turns that duration into a deadline with its own clock. Until an owner has
-- written it, the deadline is NULL and nothing may be written.
CREATE TABLE placement_group (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    cell            text NOT NULL,
    epoch           bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    lease_deadline  timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE tenants (
    tenant_id          text PRIMARY KEY CHECK (tenant_id ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),
    plan               text NOT NULL CHECK (plan IN ('free', 'pro', 'enterprise')),
    state              text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'paused', 'frozen')),
    epoch              bigint NOT NULL DEFAULT 1 CHECK (epoch >= 1),
    max_running        integer NOT NULL CHECK (max_running >= 0),
    jobs_per_second    double precision NOT NULL CHECK (jobs_per_second > 0),
    burst              integer NOT NULL CHECK (burst >= 1),
    daily_spend_limit  bigint CHECK (daily_spend_limit >= 0),
    running            integer NOT NULL DEFAULT 0 CHECK (running >= 0),
    last_served_at     timestamptz NOT NULL DEFAULT '-infinity',
    api_key_hash       bytea,
    signing_secret     text NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
-- Claims look for tenants under their cap, least recently served first.
CREATE INDEX tenants_fair_order ON tenants (last_served_at) WHERE state = 'active';
CREATE UNIQUE INDEX tenants_api_key ON tenants (api_key_hash) WHERE api_key_hash IS NOT NULL;

-- The API's token bucket per tenant; apart from `tenants` so that submissions
-- never wait on the row lock a claim holds.
CREATE TABLE rate_buckets (
    tenant_id   text PRIMARY KEY REFERENCES tenants ON DELETE CASCADE,
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL
);

-- Prepaid plans spend `available`; enterprise tenants' wallet is their daily
-- spend limit, reset when `spend_day` changes.
CREATE TABLE wallets (
    tenant_id   text PRIMARY KEY REFERENCES tenants ON DELETE CASCADE,
    available   bigint NOT NULL DEFAULT 0 CHECK (available >= 0),
    reserved    bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    spend_day   date
);

CREATE TABLE targets (
    tenant_id  text NOT NULL REFERENCES tenants ON DELETE CASCADE,
    name       text NOT NULL,
    url        text NOT NULL,
    PRIMARY KEY (tenant_id, name)
);

CREATE TABLE webhook_endpoints (
    endpoint_id      bigserial PRIMARY KEY,
    tenant_id        text NOT NULL REFERENCES tenants ON DELETE CASCADE,
    url              text NOT NULL,
    secret           text NOT NULL,
    max_concurrency  integer NOT NULL DEFAULT 4 CHECK (max_concurrency >= 1),
    -- circuit breaker: closed, open (until open_until), half_open (ramping)
    breaker          text NOT NULL DEFAULT 'closed' CHECK (breaker IN ('closed', 'open', 'half_open')),
    failures         integer NOT NULL DEFAULT 0,
    open_until       timestamptz,
    ramp_allowance   integer NOT NULL DEFAULT 0,
    UNIQUE (tenant_id, url)
);

CREATE TABLE jobs (
    job_id         uuid PRIMARY KEY,
    tenant_id      text NOT NULL REFERENCES tenants,
    status         text NOT NULL CHECK (status IN
                     ('queued', 'running', 'succeeded', 'dead', 'cancelled', 'expired')),
    target         text NOT NULL,
    step_count     integer NOT NULL CHECK (step_count BETWEEN 1 AND 32),
    payload        jsonb NOT NULL,
    attempts       integer NOT NULL DEFAULT 0,
    max_attempts   integer NOT NULL CHECK (max_attempts >= 1),
    estimate       bigint NOT NULL CHECK (estimate >= 0),
    run_after      timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz,
    -- Grows on every claim: a worker's writes are conditional on the value it
    -- claimed with, so a reaped worker that wakes up writes nothing.
    claim_epoch    bigint NOT NULL DEFAULT 0,
    claimed_by     text,
    lease_until    timestamptz,
    cancel_requested boolean NOT NULL DEFAULT false,
    -- A redriven dead job is copied into a new job (a new reservation, new
    -- step keys); the two point at each other.
    redriven_from  uuid,
    redriven_to    uuid,
    last_error     text,
    error_code     text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    finished_at    timestamptz
);
-- Serves the claim's "oldest queued job of this tenant" (ORDER BY created_at, job_id).
CREATE INDEX jobs_queued ON jobs (tenant_id, created_at, job_id) WHERE status = 'queued';
CREATE INDEX jobs_running_lease ON jobs (lease_until) WHERE status = 'running';
CREATE INDEX jobs_tenant_listing ON jobs (tenant_id, created_at DESC, job_id DESC);

CREATE TABLE job_steps (
    job_id          uuid NOT NULL REFERENCES jobs ON DELETE CASCADE,
    step            integer NOT NULL,
    idempotency_key text NOT NULL,
    status          text NOT NULL CHECK (status IN ('pending', 'succeeded')),
    result          jsonb,
    attempts        integer NOT NULL DEFAULT 0,
    finished_at     timestamptz,
    PRIMARY KEY (job_id, step)
);

-- One row per (job, kind): however many paths reach a job's refund, the
-- second insert conflicts and pays nothing.
CREATE TABLE ledger (
    entry_id    bigserial PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants,
    job_id      uuid NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('reserve', 'settle', 'refund')),
    amount      bigint NOT NULL CHECK (amount >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (job_id, kind)
);

CREATE TABLE idempotency_keys (
    tenant_id     text NOT NULL REFERENCES tenants ON DELETE CASCADE,
    key           text NOT NULL,
    request_hash  bytea NOT NULL,
    job_id        uuid NOT NULL,
    status_code   integer NOT NULL,
    response      jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);

CREATE TABLE outbox (
    event_id    uuid PRIMARY KEY,
    tenant_id   text NOT NULL REFERENCES tenants,
    job_id      uuid,
    kind        text NOT NULL,
    payload     jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    relayed_at  timestamptz
);
CREATE INDEX outbox_unrelayed ON outbox (created_at) WHERE relayed_at IS NULL;

CREATE TABLE deliveries (
    event_id         uuid NOT NULL REFERENCES outbox ON DELETE CASCADE,
    endpoint_id      bigint NOT NULL REFERENCES webhook_endpoints ON DELETE CASCADE,
    status           text NOT NULL CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_status_code integer,
    last_error       text,
    delivered_at     timestamptz,
    PRIMARY KEY (event_id, endpoint_id)
);
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status = 'pending';
