-- 0007: a fence a person put on the cell is told apart from a lease that ran out.
--
-- A fenced cell's owner keeps its lease but grants no write time (the
-- operator's domain/fencing.py), so its writes were refused as "lease
-- expired" (CPL01), the code of an owner that stopped renewing. Clients and
-- routers read that as "the cell is changing owner, ask again": a router held
-- each write for its whole hold time, for a change that does not come until
-- someone lifts the fence. The grant now records the fence's reason with the
-- deadline, and a write refused under it says so (CPF01).

ALTER TABLE placement_group ADD COLUMN fence_reason text;

CREATE OR REPLACE FUNCTION cellplane_assert_writable(moment text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    declared text := current_setting('cellplane.epoch', true);
    group_epoch bigint;
    deadline timestamptz;
    fenced text;
BEGIN
    SELECT epoch, lease_deadline, fence_reason INTO group_epoch, deadline, fenced
      FROM placement_group;
    IF declared IS NULL OR declared = '' THEN
        RAISE EXCEPTION 'write % without a placement-group epoch', moment
            USING ERRCODE = 'CPE01';
    END IF;
    IF group_epoch IS NULL OR declared::bigint <> group_epoch THEN
        RAISE EXCEPTION 'stale epoch %: the writer acts under epoch %, the placement group is at %',
            moment, declared, coalesce(group_epoch::text, 'none')
            USING ERRCODE = 'CPS01';
    END IF;
    IF deadline IS NOT NULL AND clock_timestamp() >= deadline AND fenced IS NOT NULL THEN
        RAISE EXCEPTION 'cell fenced %: %', moment, fenced
            USING ERRCODE = 'CPF01';
    END IF;
    IF deadline IS NULL OR clock_timestamp() >= deadline THEN
        RAISE EXCEPTION 'lease expired %: epoch % may act until %, it is now %',
            moment, group_epoch, coalesce(deadline::text, 'never'), clock_timestamp()
            USING ERRCODE = 'CPL01';
    END IF;
END
$$;

-- The owner's renewal, with the fence it is made under (NULL: none). Every grant
-- sets the reason, so lifting the fence is the next grant without one.
CREATE FUNCTION cellplane_grant(new_epoch bigint, remaining interval, fence text)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    granted timestamptz;
BEGIN
    UPDATE placement_group
       SET epoch = new_epoch,
           lease_deadline = clock_timestamp() + greatest(remaining, interval '0'),
           fence_reason = fence,
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

-- The two-argument grant (an operator from before this migration) grants without a fence.
CREATE OR REPLACE FUNCTION cellplane_grant(new_epoch bigint, remaining interval)
RETURNS timestamptz
LANGUAGE sql AS $$
    SELECT cellplane_grant(new_epoch, remaining, NULL::text)
$$;
