-- The limits of one (org, provider) beyond its request rate, in Redis: one atomic step per call.
--
-- Run by actors.pacing.redis_pacer.RedisPacer (EVALSHA; loaded again on NOSCRIPT). Reads
-- the server's clock (TIME). The same rules in Python are
-- actors.pacing.quotas.QuotaState; tests/actors/pacing/shared/test_quota_rules_conformance.py
-- runs both on the same operations and requires the same replies.
--
-- KEYS[1]: a hash. 'sig': the limits it was written under (other limits: the hash starts
-- anew); per limit i (1-based here, 0-based in Python): 't<i>' a rate's GCRA theoretical
-- arrival time (ITU-T I.371); 'b<i>:<n>' a quota's units in sub-bucket n (of window/60
-- seconds); 'a<i>' / 'r<i>' a live announcement's units remaining and reset time.
--
-- ARGV: op, ttl_ms, sig, L (limits), then per limit: is_rate (1/0), amount, window_s,
-- burst (<0: a tenth of amount), then the operation's own:
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
local sig = ARGV[3]
local L = tonumber(ARGV[4])
local lims = {}
for i = 1, L do
  local at = 4 + (i - 1) * 4
  lims[i] = {rate = ARGV[at + 1] == '1', amount = tonumber(ARGV[at + 2]),
             window = tonumber(ARGV[at + 3]), burst = tonumber(ARGV[at + 4])}
end
local base = 4 + L * 4

local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6

if redis.call('HGET', key, 'sig') ~= sig then
  redis.call('DEL', key)
  redis.call('HSET', key, 'sig', sig)
end

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

-- the sub-buckets of quota i: {n -> units}, and their sorted numbers
local function counts(i)
  local flat = redis.call('HGETALL', key)
  local out, order = {}, {}
  local prefix = 'b' .. i .. ':'
  for j = 1, #flat, 2 do
    local f = flat[j]
    if string.sub(f, 1, #prefix) == prefix then
      local n = tonumber(string.sub(f, #prefix + 1))
      out[n] = tonumber(flat[j + 1])
      order[#order + 1] = n
    end
  end
  table.sort(order)
  return out, order
end

-- expire: lapsed announcements, sub-buckets out of the window
for i, lim in ipairs(lims) do
  if not lim.rate then
    local r = num('r' .. i)
    if r and now >= r then redis.call('HDEL', key, 'a' .. i, 'r' .. i) end
    local c, order = counts(i)
    local oldest = bucket(now, lim) - span(lim)
    for _, n in ipairs(order) do
      if n < oldest then redis.call('HDEL', key, 'b' .. i .. ':' .. n) end
    end
  end
end

local function room(i, lim)
  if lim.rate then
    local r = lim.amount / lim.window
    local tat = num('t' .. i) or 0
    local ahead = tat - now
    if ahead < 0 then ahead = 0 end
    local v = burst(lim, 0) - ahead * r
    if v < 0 then v = 0 end
    return v
  end
  local a = num('a' .. i)
  if a then
    if a < 0 then return 0 end
    return a
  end
  local c, order = counts(i)
  local held = 0
  for _, n in ipairs(order) do held = held + c[n] end
  local v = lim.amount - held
  if v < 0 then v = 0 end
  return v
end

-- seconds until u more units fit after 'before' taken in this op; seconds until renewal
local function wait(i, lim, before, u)
  local total = before + u
  if lim.rate then
    local r = lim.amount / lim.window
    local start = num('t' .. i) or 0
    if start < now then start = now end
    local need = start + total / r - burst(lim, u) / r - now
    if need > EPS then return need, need end
    return 0, 0
  end
  if u > lim.amount + EPS then return math.huge, math.huge end
  local a = num('a' .. i)
  if a then
    if total <= a + EPS then return 0, 0 end
    local r = num('r' .. i)
    return r - now, r - now
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
  if held + u <= lim.amount + EPS then return 0, 0 end
  local d = lim.window / SUB
  local renew = 0
  for _, n in ipairs(order) do
    held = held - c[n]
    renew = (n + span(lim) + 1) * d - now
    if held + u <= lim.amount + EPS then break end
  end
  local first = 0
  if #order > 0 then first = (order[1] + span(lim) + 1) * d - now end
  if first < 0 then first = 0 end
  if renew < EPS * 2 then renew = EPS * 2 end
  return renew, first
end

local function add(i, lim, total)
  if total <= 0 then return end
  if lim.rate then
    local r = lim.amount / lim.window
    local tat = num('t' .. i) or 0
    if tat < now then tat = now end
    redis.call('HSET', key, 't' .. i, fmt(tat + total / r))
    return
  end
  local f = 'b' .. i .. ':' .. bucket(now, lim)
  redis.call('HSET', key, f, fmt((num(f) or 0) + total))
  local a = num('a' .. i)
  if a then redis.call('HSET', key, 'a' .. i, fmt(a - total)) end
end

local function less(i, lim, total, at)
  if total <= 0 then return end
  if lim.rate then
    local r = lim.amount / lim.window
    local tat = num('t' .. i) or 0
    local floor = tat
    if now < floor then floor = now end
    local v = tat - total / r
    if v < floor then v = floor end
    redis.call('HSET', key, 't' .. i, fmt(v))
    return
  end
  local a = num('a' .. i)
  if a then redis.call('HSET', key, 'a' .. i, fmt(a + total)) end
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
        redis.call('HDEL', key, 'b' .. i .. ':' .. n)
      else
        redis.call('HSET', key, 'b' .. i .. ':' .. n, fmt(left))
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
  redis.call('HSET', key, 'a' .. i, fmt(remaining - granted), 'r' .. i, fmt(now + reset))
end

redis.call('PEXPIRE', key, ttl_ms)
local reply = {fmt(now)}
for i, lim in ipairs(lims) do reply[#reply + 1] = fmt(room(i, lim)) end
for _, x in ipairs(extra) do reply[#reply + 1] = x end
return reply
