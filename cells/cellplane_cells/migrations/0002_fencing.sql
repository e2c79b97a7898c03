-- 0002: every write to the cell's data is conditional on the placement group.
--
-- A writer declares the epoch it acts under in the session setting
-- `cellplane.epoch` (the connection pool sets it on every connection). A
-- statement-level trigger on every table of tenant data compares it with the
-- placement_group row and checks the lease deadline against this database's
-- own clock. So a writer holding an old epoch, or one whose owner stopped
-- renewing, is refused by the database itself, whatever the code path and
-- whatever the writer's clock says.

-- The check itself; 0004 calls it again at commit.
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

CREATE FUNCTION cellplane_guard_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM cellplane_assert_writable(format('on %s', TG_TABLE_NAME));
    RETURN NULL;
END
$$;

DO $$
DECLARE
    guarded text;
BEGIN
    FOREACH guarded IN ARRAY ARRAY['tenants', 'rate_buckets', 'wallets', 'targets',
        'webhook_endpoints', 'jobs', 'job_steps', 'ledger', 'idempotency_keys', 'outbox',
        'deliveries']
    LOOP
        EXECUTE format('CREATE TRIGGER cellplane_guard BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE '
                       'ON %I FOR EACH STATEMENT EXECUTE FUNCTION cellplane_guard_write()', guarded);
    END LOOP;
END
$$;

-- The owner's renewal: it may only keep or raise the epoch, never lower it.
-- `remaining` is a duration on the owner's monotonic clock; the deadline is
-- computed here, with this database's clock.
CREATE FUNCTION cellplane_grant(new_epoch bigint, remaining interval) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    granted timestamptz;
BEGIN
    UPDATE placement_group
       SET epoch = new_epoch,
           lease_deadline = clock_timestamp() + greatest(remaining, interval '0'),
           updated_at = clock_timestamp()
     WHERE epoch <= new_epoch
    RETURNING lease_deadline INTO granted;
    IF granted IS NULL THEN
        RAISE EXCEPTION 'stale epoch: % is below the placement group''s epoch', new_epoch
            USING ERRCODE = 'CPS01';
    END IF;
    RETURN granted;
END
$$;
