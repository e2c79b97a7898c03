-- 0005: a tenant can leave a cell and keep its data there ("retired").
--
-- DELETE /admin/v1/tenants/{id}?policy=retain sets the state: every row of the
-- tenant stays, its API key no longer authenticates (tenant_by_key skips
-- retired tenants), and no job of it is claimed (claims take active tenants
-- only). A later PUT of the tenant makes it active again, with the same key.
-- A state rather than a cleared key hash: the key survives the retirement, so
-- re-placing the tenant here needs no new key and no Secret rewritten.
ALTER TABLE tenants
    DROP CONSTRAINT tenants_state_check,
    ADD CONSTRAINT tenants_state_check
        CHECK (state IN ('active', 'paused', 'frozen', 'retired'));
