-- The limits of one (org, provider) beyond its request rate, in Redis: one atomic step per call.
--
-- Run by actors.pacing.redis_pacer.RedisPacer (EVALSHA; loaded again on NOSCRIPT). Reads
-- the server's clock (TIME). The same rules in Python are
-- actors.pacing.quotas.QuotaState; tests/actors/pacing/shared/test_quota_rules_conformance.py
-- runs both on the same operations and requires the same replies.
--
-- KEYS[1]: a hash. Per limit, under its own identity k (quotas.limit_key: kind, window,
-- amount, unit; never its place in a list, so callers stating different lists share the
-- limits they have in common and never reset each other's): 't:<k>' a rate's GCRA
-- theoretical arrival time (ITU-T I.371); 'b:<k>#<n>' a quota's units in sub-bucket n (of
-- window/60 seconds); 'a:<k>' / 'r:<k>' a live announcement's units remaining and reset
-- time. Limits are numbered 1-based here, 0-based in Python, in the caller's order.
--
-- ARGV: op, ttl_ms, L (limits), then per limit: is_rate (1/0), amount, window_s,
-- burst (<0: a tenth of amount), k, then the operation's own:
--   take      k (requests), then k * L units (request 1's per limit, request 2's, ...)
--   giveback  age_s, then L units
--   correct   age_s, then L deltas
--   announce  limit (1-based), remaining, reset_s, sent_ago_s
-- Reply: now, room per limit, then for a take: granted, wait_s, limit (0-based, -1),
-- reset_s. Numbers as strings (a Lua number would be cut to an integer).

local SUB = 60
local SLACK_S = 1.0  -- quotas.SLACK_S
local EPS = 1e-9
local key = KEYS[1]
local op = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local L = tonumber(ARGV[3])
local lims = {}
local first = {}  -- a limit stated twice is one limit: only its first place writes
for i = 1, L do
  local at = 3 + (i - 1) * 5
  local k = ARGV[at + 5]
  lims[i] = {rate = ARGV[at + 1] == '1', amount = tonumber(ARGV[at + 2]),
             window = tonumber(ARGV[at + 3]), burst = tonumber(ARGV[at + 4]), key = k}
  if first[k] == nil then first[k] = i end
end
local base = 3 + L * 5

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6

local function fmt(x)
  if x == math.huge then return 'inf' end
  return string.format('%.17g', x)
end

-- sub-buckets counted before the current one: the window's and the slack's (quotas.span)
local function span(lim)
  local d = lim.window / SUB
  local slack = math.ceil(SLACK_S / d - 1e-9)
  if slack < 1 then slack = 1 end
  return SUB + slack
end

local function bucket(x, lim)
  return math.floor(x / (lim.window / SUB))
end

local function burst(lim, units)
  local b = lim.burst
  if b < 0 then b = lim.amount / 10 end
  if units > b then return units end
  return b
end

local function num(field)
  local v = redis.call('HGET', key, field)
  if v then return tonumber(v) end
  return nil
end

-- the hash's field of limit i's state s ('t', 'a', 'r', 'b')
local function fld(s, i)
  return s .. ':' .. lims[i].key
end

-- the sub-buckets of quota i: {n -> units}, and their sorted numbers
local function counts(i)
  local flat = redis.call('HGETALL', key)
  local out, order = {}, {}
  local prefix = fld('b', i) .. '#'
  for j = 1, #flat, 2 do
    local f = flat[j]
    if string.sub(f, 1, #prefix) == prefix then
      local n = tonumber(string.sub(f, #prefix + 1))
      if n then
        out[n] = tonumber(flat[j + 1])
        order[#order + 1] = n
      end
    end
  end
  table.sort(order)
  return out, order
end

-- expire: lapsed announcements, sub-buckets out of the window
for i, lim in ipairs(lims) do
  if not lim.rate and first[lim.key] == i then
    local r = num(fld('r', i))
    if r and now >= r then redis.call('HDEL', key, fld('a', i), fld('r', i)) end
    local c, order = counts(i)
    local oldest = bucket(now, lim) - span(lim)
    for _, n in ipairs(order) do
      if n < oldest then redis.call('HDEL', key, fld('b', i) .. '#' .. n) end
    end
  end
end

local function room(i, lim)
  if lim.rate then
    local r = lim.amount / lim.window
    local tat = num(fld('t', i)) or 0
    local ahead = tat - now
    if ahead < 0 then ahead = 0 end
    local v = burst(lim, 0) - ahead * r
    if v < 0 then v = 0 end
    return v
  end
  local c, order = counts(i)
  local held = 0
  for _, n in ipairs(order) do held = held + c[n] end
  local v = lim.amount - held
  if v < 0 then v = 0 end
  local a = num(fld('a', i))
  if a then  -- an announcement only lowers it: the stated limit always holds
    if a < 0 then a = 0 end
    if a < v then v = a end
  end
  return v
end

-- seconds until u more units fit after 'before' taken in this op; seconds until renewal
local function wait(i, lim, before, u)
  local total = before + u
  if lim.rate then
    local r = lim.amount / lim.window
    local start = num(fld('t', i)) or 0
    if start < now then start = now end
    local need = start + total / r - burst(lim, u) / r - now
    if need > EPS then return need, need end
    return 0, 0
  end
  if u > lim.amount + EPS then return math.huge, math.huge end
  local fw, fr = 0, 0
  local a = num(fld('a', i))
  if a and total > a + EPS then
    local r = num(fld('r', i))
    fw, fr = r - now, r - now
  end
  local c, order = counts(i)
  if before > 0 then
    local b = bucket(now, lim)
    if c[b] then
      c[b] = c[b] + before
    else
      c[b] = before
      order[#order + 1] = b
      table.sort(order)
    end
  end
  local held = 0
  for _, n in ipairs(order) do held = held + c[n] end
  if held + u <= lim.amount + EPS then return fw, fr end
  local d = lim.window / SUB
  local renew = 0
  for _, n in ipairs(order) do
    held = held - c[n]
    renew = (n + span(lim) + 1) * d - now
    if held + u <= lim.amount + EPS then break end
  end
  local renews = 0
  if #order > 0 then renews = (order[1] + span(lim) + 1) * d - now end
  if renews < 0 then renews = 0 end
  if renew < EPS * 2 then renew = EPS * 2 end
  if fw > renew then return fw, fr end
  return renew, renews
end

local function add(i, lim, total)
  if total <= 0 or first[lim.key] ~= i then return end
  if lim.rate then
    local r = lim.amount / lim.window
    local tat = num(fld('t', i)) or 0
    if tat < now then tat = now end
    redis.call('HSET', key, fld('t', i), fmt(tat + total / r))
    return
  end
  local f = fld('b', i) .. '#' .. bucket(now, lim)
  redis.call('HSET', key, f, fmt((num(f) or 0) + total))
  local a = num(fld('a', i))
  if a then redis.call('HSET', key, fld('a', i), fmt(a - total)) end
end

local function less(i, lim, total, at)
  if total <= 0 or first[lim.key] ~= i then return end
  if lim.rate then
    local r = lim.amount / lim.window
    local tat = num(fld('t', i)) or 0
    local floor = tat
    if now < floor then floor = now end
    local v = tat - total / r
    if v < floor then v = floor end
    redis.call('HSET', key, fld('t', i), fmt(v))
    return
  end
  local a = num(fld('a', i))
  if a then redis.call('HSET', key, fld('a', i), fmt(a + total)) end
  local c, order = counts(i)
  local start = bucket(at, lim)
  for j = #order, 1, -1 do
    local n = order[j]
    if n <= start then
      local taken = c[n]
      if total < taken then taken = total end
      local left = c[n] - taken
      total = total - taken
      if left <= EPS then
        redis.call('HDEL', key, fld('b', i) .. '#' .. n)
      else
        redis.call('HSET', key, fld('b', i) .. '#' .. n, fmt(left))
      end
      if total <= EPS then break end
    end
  end
end

local extra = {}
if op == 'take' then
  local k = tonumber(ARGV[base + 1])
  local sums = {}
  for i = 1, L do sums[i] = 0 end
  local granted, w, held, reset = 0, 0, -1, 0
  for q = 1, k do
    local fits = true
    for i, lim in ipairs(lims) do
      local u = tonumber(ARGV[base + 1 + (q - 1) * L + i])
      local wi, ri = wait(i, lim, sums[i], u)
      if wi > EPS then
        if fits or wi > w then w, held, reset = wi, i - 1, ri end
        fits = false
      end
    end
    if not fits then break end
    for i = 1, L do sums[i] = sums[i] + tonumber(ARGV[base + 1 + (q - 1) * L + i]) end
    granted = granted + 1
  end
  for i, lim in ipairs(lims) do add(i, lim, sums[i]) end
  if granted == k then w, held, reset = 0, -1, 0 end
  extra = {tostring(granted), fmt(w), tostring(held), fmt(reset)}
elseif op == 'giveback' or op == 'correct' then
  local age = tonumber(ARGV[base + 1])
  if age < 0 then age = 0 end
  for i, lim in ipairs(lims) do
    local v = tonumber(ARGV[base + 1 + i])
    if op == 'correct' and v > 0 then
      add(i, lim, v)
    elseif op == 'correct' then
      less(i, lim, -v, now - age)
    else
      less(i, lim, v, now - age)
    end
  end
elseif op == 'announce' then
  local i = tonumber(ARGV[base + 1])
  local lim = lims[i]
  local remaining = tonumber(ARGV[base + 2])
  local reset = tonumber(ARGV[base + 3])
  local ago = tonumber(ARGV[base + 4])
  if ago < 0 then ago = 0 end
  if remaining < 0 then remaining = 0 end
  if reset < 0 then reset = 0 end
  if reset > lim.window then reset = lim.window end
  local since = bucket(now - ago, lim)
  local c, order = counts(i)
  local granted = 0
  for _, n in ipairs(order) do
    if n >= since then granted = granted + c[n] end
  end
  redis.call('HSET', key, fld('a', i), fmt(remaining - granted), fld('r', i), fmt(now + reset))
end

redis.call('PEXPIRE', key, ttl_ms)
local reply = {fmt(now)}
for i, lim in ipairs(lims) do reply[#reply + 1] = fmt(room(i, lim)) end
for _, x in ipairs(extra) do reply[#reply + 1] = x end
return reply
