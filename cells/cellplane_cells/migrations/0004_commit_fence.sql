-- 0004: the placement-group check again at COMMIT.
--
-- The statement trigger (0002) refuses every statement issued after the
-- deadline or under a stale epoch. A transaction whose statements all ran
-- before the deadline could still COMMIT after it; that write would land on a
-- primary that had already lost its lease. This deferred check runs when the
-- transaction commits, once per transaction (a transaction-local flag skips
-- the rows after the first), so no write of a stale owner becomes durable.

-- One check for both triggers: the statement trigger of 0002 is redefined
-- to call it too, so the two can never disagree.
CREATE FUNCTION cellplane_assert_writable(moment text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    declared text := current_setting('cellplane.epoch', true);
    group_epoch bigint;
    deadline timestamptz;
BEGIN
    SELECT epoch, lease_deadline INTO group_epoch, deadline FROM placement_group;
    IF declared IS NULL OR declared = '' THEN
        RAISE EXCEPTION 'write % without a placement-group epoch', moment
            USING ERRCODE = 'CPE01';
    END IF;
    IF group_epoch IS NULL OR declared::bigint <> group_epoch THEN
        RAISE EXCEPTION 'stale epoch %: the writer acts under epoch %, the placement group is at %',
            moment, declared, coalesce(group_epoch::text, 'none')
            USING ERRCODE = 'CPS01';
    END IF;
    IF deadline IS NULL OR clock_timestamp() >= deadline THEN
        RAISE EXCEPTION 'lease expired %: epoch % may act until %, it is now %',
            moment, group_epoch, coalesce(deadline::text, 'never'), clock_timestamp()
            USING ERRCODE = 'CPL01';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION cellplane_guard_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cellplane_assert_writable(format('on %s', TG_TABLE_NAME));
    RETURN NULL;
END
$$;

CREATE FUNCTION cellplane_guard_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('cellplane.commit_checked', true) = 'yes' THEN
        RETURN NULL;
    END IF;
    PERFORM cellplane_assert_writable('at commit');
    PERFORM set_config('cellplane.commit_checked', 'yes', true);
    RETURN NULL;
END
$$;

DO $$
DECLARE
    guarded text;
BEGIN
    FOREACH guarded IN ARRAY ARRAY['tenants', 'rate_buckets', 'wallets', 'targets',
        'webhook_endpoints', 'jobs', 'job_steps', 'ledger', 'idempotency_keys', 'outbox',
        'deliveries', 'delivery_attempts']
    LOOP
        EXECUTE format('CREATE CONSTRAINT TRIGGER cellplane_guard_commit AFTER INSERT OR UPDATE OR DELETE '
                       'ON %I DEFERRABLE INITIALLY DEFERRED FOR EACH ROW '
                       'EXECUTE FUNCTION cellplane_guard_commit()', guarded);
    END LOOP;
END
$$;
