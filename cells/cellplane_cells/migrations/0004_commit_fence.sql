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
