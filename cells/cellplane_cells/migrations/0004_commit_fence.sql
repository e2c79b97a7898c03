-- 0004: the placement-group check again at COMMIT.
--
-- The statement trigger (0002) refuses every statement issued after the
-- deadline or under a stale epoch. A transaction whose statements all ran
-- before the deadline could still COMMIT after it; that write would land on a
-- primary that had already lost its lease. This deferred check runs when the
-- transaction commits, once per transaction (a transaction-local flag skips
-- the rows after the first), so no write of a stale owner becomes durable.

CREATE FUNCTION cellplane_guard_commit() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    declared text := current_setting('cellplane.epoch', true);
    group_epoch bigint;
    deadline timestamptz;
BEGIN
    IF current_setting('cellplane.commit_checked', true) = 'yes' THEN
        RETURN NULL;
    END IF;
    SELECT epoch, lease_deadline INTO group_epoch, deadline FROM placement_group;
    IF declared IS NULL OR declared = '' OR declared::bigint <> group_epoch THEN
        RAISE EXCEPTION 'stale epoch at commit: the writer acts under epoch %, the placement group is at %',
            coalesce(declared, 'none'), group_epoch
            USING ERRCODE = 'CPS01';
    END IF;
    IF deadline IS NULL OR clock_timestamp() >= deadline THEN
        RAISE EXCEPTION 'lease expired at commit: epoch % could act until %, it is now %',
            group_epoch, coalesce(deadline::text, 'never'), clock_timestamp()
            USING ERRCODE = 'CPL01';
    END IF;
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
