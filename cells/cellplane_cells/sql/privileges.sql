-- Who may do what in the cell database; applied by migrate() after every run, so it
-- follows the schema as migrations add tables and columns (a column added to a
-- table with a secret is readable by every role at once, the secret never).
--
-- The tables belong to the superuser that migrates (the operator); the cell's
-- processes connect as the roles of roles.py, none of which owns anything, so
-- none can alter the schema. Each role gets DML on the tenant data, SELECT on
-- placement_group (the fencing trigger reads it as the writer) and no access
-- to schema_migrations. The placement group is written only through the
-- owner's grant (cellplane_grant), which only the superuser may call.
--
-- Secrets are kept apart by column privileges, not a separate table: the
-- secret stays in the row it belongs to, so the move's copy, its change
-- capture (0006) and every foreign key work as before, and a role that may not
-- read it is refused by the database itself whatever its query says
-- ("permission denied for table tenants"). A role without the secret gets
-- SELECT and UPDATE on every other column (INSERT and DELETE on the table).
DO $$
DECLARE
    role_name text;
    relation record;
    secret_column text;
    readers text[];
    readable text;
    grant_function regprocedure;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['cellplane_api', 'cellplane_admin_api',
                                     'cellplane_worker', 'cellplane_relay']
    LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = role_name) THEN
            BEGIN
                -- NOLOGIN until the operator gives it a password (sites/database.py).
                EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database of this cluster made it meanwhile
            END;
        END IF;
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA public FROM %I', role_name);
        EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', role_name);
        EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO %I', role_name);
        EXECUTE format('GRANT SELECT ON placement_group TO %I', role_name);
        FOR relation IN
            SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
               AND c.relname NOT IN ('schema_migrations', 'placement_group')
        LOOP
            secret_column := CASE relation.relname WHEN 'tenants' THEN 'signing_secret'
                                                   WHEN 'webhook_endpoints' THEN 'secret' END;
            readers := CASE relation.relname
                           WHEN 'tenants' THEN ARRAY['cellplane_admin_api', 'cellplane_worker']
                           WHEN 'webhook_endpoints' THEN ARRAY['cellplane_admin_api', 'cellplane_relay']
                       END;
            IF secret_column IS NULL OR role_name = ANY (readers) THEN
                EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO %I',
                               relation.relname, role_name);
            ELSE
                SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO readable
                  FROM pg_attribute
                 WHERE attrelid = relation.oid AND attnum > 0 AND NOT attisdropped
                   AND attname <> secret_column;
                EXECUTE format('GRANT INSERT, DELETE ON %I TO %I', relation.relname, role_name);
                EXECUTE format('GRANT SELECT (%s), UPDATE (%s) ON %I TO %I',
                               readable, readable, relation.relname, role_name);
            END IF;
        END LOOP;
    END LOOP;
    FOR grant_function IN SELECT oid::regprocedure FROM pg_proc WHERE proname = 'cellplane_grant'
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', grant_function);
    END LOOP;
END
$$;
