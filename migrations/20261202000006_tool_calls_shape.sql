-- `tool_calls` holds a JSON array of calls (DESIGN.md section 2). An agent that
-- serializes the array itself and binds the text stores it double-encoded, as a JSON
-- string: the ids inside are then invisible to SQL, and were to the planner, so a call
-- could be archived away from its result. New rows must be an array (or null); the error
-- names the constraint, and so the expected shape.
--
-- NOT VALID first, so that adding the constraint never fails on rows written before it;
-- it is then validated when no existing row breaks it. A database holding such rows
-- keeps them untouched (they are the agent's data): the worker reads a double-encoded
-- array as the array, and `summarizer check` lists them (tool_calls_not_an_array).
ALTER TABLE messages ADD CONSTRAINT tool_calls_is_array
    CHECK (tool_calls IS NULL OR jsonb_typeof(tool_calls) IN ('array', 'null')) NOT VALID;

DO $$
BEGIN
    ALTER TABLE messages VALIDATE CONSTRAINT tool_calls_is_array;
EXCEPTION WHEN check_violation THEN
    RAISE NOTICE 'messages holds tool_calls that are not an array; '
                 'tool_calls_is_array stays NOT VALID (see summarizer check)';
END
$$;

-- The calls of a stored `tool_calls` value as the worker reads them (Message::calls): an
-- array as is, a JSON string holding an array decoded, anything else no calls. For
-- `summarizer check`, which must pair calls and results exactly as the planner does.
CREATE FUNCTION tool_calls_array(calls jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    decoded jsonb;
BEGIN
    IF jsonb_typeof(calls) = 'array' THEN
        RETURN calls;
    END IF;
    IF jsonb_typeof(calls) = 'string' THEN
        BEGIN
            decoded := (calls #>> '{}')::jsonb;
        EXCEPTION WHEN invalid_text_representation THEN
            RETURN '[]';
        END;
        IF jsonb_typeof(decoded) = 'array' THEN
            RETURN decoded;
        END IF;
    END IF;
    RETURN '[]';
END
$$;
