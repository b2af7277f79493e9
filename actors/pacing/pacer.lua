-- The pacing state of one (org, provider) in Redis: one atomic step per call.
--
-- Run by actors.pacing.redis_pacer.RedisPacer (SCRIPT LOAD once, EVALSHA per call, loaded
-- again on NOSCRIPT), with the operation named in ARGV[1]. Each call is one round trip,
-- runs atomically on the server, reads the time from the server (TIME, so a worker whose
-- clock is off cannot skew anyone's pacing) and leaves every key it writes with a TTL.
--
-- The same rules in Python are actors.pacing.pacer_state.BucketState (the in-process
-- pacer); tests/actors/pacing/shared/test_pacer_rules_conformance.py runs both on the same
-- sequences of operations and requires the same replies.
--
-- Keys:
-- * KEYS[1]: a hash, the state of one (org, provider): GCRA's theoretical arrival time
--   'tat' (ITU-T I.371), the rate 'rate' (requests per second, 0 = unpaced), the rate
--   before the last cut 'ref', 'ver' (bumped by every cut or set), 'ss' (slow start),
--   the moving average of grants 'used'/'used_at' (-1: no grant yet; the first starts
--   it at the rate itself, in use), the Retry-After pause 'pause', and
--   the circuit: consecutive unavailable outcomes 'c_fail', open until 'c_open'
--   (0 = closed), period 'c_period', half-open probe lease 'c_probe'.
--   A rate change keeps the tokens owed, not the time: the part of 'tat' still ahead is
--   rescaled by old rate / new rate, so a new rate applies from the moment it is set.
-- * KEYS[2]: a sorted set of worker ids scored by their last take (how many workers
--   share the bucket; their local share when Redis is away). A take updates it only when
--   it names its worker (the client does every presence_s / 4), and answers their count
--   and the worker's rank among them by name (its local share's phase); otherwise it
--   answers -1 for both (unchanged).
-- * KEYS[3]: a string, the worker holding the learner lease of a provider whose limit
--   is unknown (SET NX PX, renewed by each 'learn' of its holder; it lapses when the
--   holder dies or goes quiet, and the next 'learn' of any worker takes it).
-- * KEYS[4]: a hash of the fairness keys taking from the bucket (runs, customers): field
--   = the key, value = 'tat seen weight wants': its own GCRA time at its share, its last
--   take, its weight, and 1 when that take was granted fewer tokens than it asked (it
--   wants more). A keyed take counts the keys that took within fair_window_s and want
--   more; with any besides itself, it also keeps to its share, rate * weight / (its
--   weight + theirs), with the burst scaled alike (at least 1; an all-or-none take at
--   least its n). With none it may use the whole rate (an idle share is lent), owing its
--   share at most its share's burst. A key idle past the window, owing nothing, is
--   deleted by the next keyed take; the hash has the state's TTL.
--
-- Workers back from pacing locally ('rejoin': the hand-over from a worker's local share):
-- the hash keeps how many workers are presumed still local 'aw_n', each at the share of
-- the rate 'aw_share', counted at 'aw_at' by the first worker back and held until
-- 'aw_until'. Meanwhile a take paces at the rate less their shares, so the workers back
-- on Redis and those still local stay within the rate together; each worker back
-- (having gone local before 'aw_at') takes one off the count.
--
-- Learning an unknown limit together (actors.pacing.shared_learner): the hash also keeps
-- 'acc' (responses accepted, every worker's, added by 'learn'), the last congestion
-- event ('ev' counted by each cutting 'pause', at 'ev_at', when 'acc' was 'ev_acc'), and
-- what the learner published: the limit estimate 'lim', its phase 'ph' and its 'cuts'.
-- 'learn' publishes a rate without bumping 'ver' (only a congestion event does, so a 429
-- for a request granted before the learner's last publication is still a new event).
--
-- ARGV: op, init_rate, init_ss, burst (<0: one call plus 10 ms of the rate), ttl_ms,
-- use_window_s, then the operation's own:
--   take    n, partial (1/0), worker ('' = do not touch KEYS[2]), presence_s, probe_lease_s,
--           nested (1/0: a nested call, not held back by a half-open probe out),
--           keyed (1/0: a fairness key takes; 0: KEYS[4] is not touched), key, weight,
--           fair_window_s
--   pause   pause_s, cut_version (<0: no cut), decrease, slow_start_decrease, min_rps,
--           unpaced_start_rps
--   grow    add_rps, mul, max_rps (0: no cap), in_use_fraction
--   set     rate_rps (0: unpaced), slow_start (1/0)
--   record  answered, unavailable, circuit_failures (0: never opens), open_s, open_max_s
--   learn   accepted, holder ('' = only read), lease_ms, rate (<0: publish nothing),
--           slow_start, limit_rps, phase, cuts, in_use_fraction
--   rejoin  spent (tokens), pause_s, rate (0: none learnt), away (workers), share,
--           since_s, away_s
--   state   (none)
-- Every reply starts now, rate, ref, ver, ss; actors.pacing.redis_pacer.parse_reply reads the rest.

local key, wkey, lkey, fkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op = ARGV[1]
local init_rate, init_ss = tonumber(ARGV[2]), tonumber(ARGV[3])
local burst_arg, ttl_ms, use_window = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local names = {'tat', 'rate', 'ref', 'ver', 'ss', 'used', 'used_at', 'pause',
               'c_fail', 'c_open', 'c_period', 'c_probe',
               'acc', 'ev', 'ev_at', 'ev_acc', 'lim', 'ph', 'cuts',
               'aw_n', 'aw_share', 'aw_at', 'aw_until'}
local raw = redis.call('HMGET', key, unpack(names))
local s = {}
for i, name in ipairs(names) do s[name] = tonumber(raw[i]) end
local absent = s.rate == nil
if absent then
  s = {tat = 0, rate = init_rate, ref = init_rate, ver = 0, ss = init_ss, used = -1,
       used_at = now, pause = 0, c_fail = 0, c_open = 0, c_period = 0, c_probe = 0}
end
for _, name in ipairs({'acc', 'ev', 'ev_at', 'ev_acc', 'lim', 'ph', 'cuts',
                       'aw_n', 'aw_share', 'aw_at', 'aw_until'}) do
  if s[name] == nil then s[name] = 0 end
end

local function fmt(x) return string.format('%.17g', x) end
local function burst()
  local b = burst_arg
  if b < 0 then b = 1 + s.rate / 100 end
  if b < 1 then b = 1 end
  return b
end
local function used_rps()
  if s.used < 0 then return 0 end
  local age = now - s.used_at
  if age < 0 then age = 0 end
  return s.used * math.exp(-age / use_window) / use_window
end
local fresh = absent
local function save(only)
  local flat = {}
  local which = names
  if only and not fresh then which = only end
  for _, name in ipairs(which) do
    flat[#flat + 1] = name
    flat[#flat + 1] = fmt(s[name])
  end
  redis.call('HSET', key, unpack(flat))
  local last = math.max(s.tat, s.pause, s.c_open, s.c_probe)
  local extra = 0
  if last > now then extra = math.ceil((last - now) * 1000) end
  redis.call('PEXPIRE', key, ttl_ms + extra)
end
local function rescale(old)
  if old > 0 and s.rate > 0 and s.tat > now then s.tat = now + (s.tat - now) * old / s.rate end
end
local function state(extra)
  local out = {fmt(now), fmt(s.rate), fmt(s.ref), tostring(s.ver), tostring(s.ss)}
  for _, v in ipairs(extra) do out[#out + 1] = v end
  return out
end

if op == 'take' then
  local n, partial = tonumber(ARGV[7]), ARGV[8] == '1'
  local worker, presence_s = ARGV[9], tonumber(ARGV[10])
  local probe_lease, nested = tonumber(ARGV[11]), ARGV[12] == '1'
  local workers, rank = -1, -1
  if worker ~= '' then
    redis.call('ZADD', wkey, now, worker)
    redis.call('ZREMRANGEBYSCORE', wkey, '-inf', now - presence_s)
    redis.call('PEXPIRE', wkey, math.ceil(presence_s * 2000))
    workers, rank = redis.call('ZCARD', wkey), 0
    for _, other in ipairs(redis.call('ZRANGE', wkey, 0, -1)) do
      if other < worker then rank = rank + 1 end
    end
  end
  local function reply(k, wait, verdict)
    local owed = 0
    if s.rate > 0 and s.tat > now then owed = s.tat - now end
    return state({k, wait, verdict, tostring(workers), fmt(owed), tostring(rank)})
  end
  local verdict = 'go'
  if s.c_open > 0 then
    if now < s.c_open then
      return reply('0', fmt(s.c_open - now), 'refuse')
    end
    if s.c_probe <= now then
      verdict, n, partial = 'probe', 1, true
    elseif not nested then
      -- a nested call's parent, waiting on it, may be the probe out: it goes by the rate
      return reply('0', fmt(s.c_probe - now), 'wait')
    end
  end
  if now < s.pause then
    return reply('0', fmt(s.pause - now), 'paused')
  end
  local k = n
  local wait = 0
  if s.rate > 0 then
    -- workers presumed still pacing locally keep their shares of the rate (see 'rejoin')
    local keep = 1
    if s.aw_until > now and s.aw_n > 0 then keep = math.max(0.05, 1 - s.aw_n * s.aw_share) end
    local T, b = 1 / (s.rate * keep), math.max(1, burst() * keep)
    local tat = math.max(s.tat, now)
    -- tat and now are epoch seconds (about 1.8e9: a double's step there is 0.24 µs), so
    -- the time still owed is taken first and given 1 µs of slack: an idle bucket grants
    -- its whole burst (burst 1 included), never a token less
    local avail = math.floor((b * T - (tat - now) + 1e-6) / T)
    -- a fairness key keeps to its weighted share while other keys want more (KEYS[4])
    local me, share, kname = nil, 1, nil
    if ARGV[13] == '1' then
      kname = ARGV[14]
      local weight, since = tonumber(ARGV[15]), now - tonumber(ARGV[16])
      local flat = redis.call('HGETALL', fkey)
      local shares, names = {}, {}
      for i = 1, #flat, 2 do
        local ct, cs, cw, cn = string.match(flat[i + 1], '^(%S+) (%S+) (%S+) (%S+)$')
        shares[flat[i]] = {tat = tonumber(ct), seen = tonumber(cs), w = tonumber(cw), wants = tonumber(cn)}
        names[#names + 1] = flat[i]
      end
      table.sort(names)
      local gone = {}
      for _, name in ipairs(names) do
        local c = shares[name]
        if name ~= kname and c.seen < since and c.tat <= now then
          gone[#gone + 1] = name
          shares[name] = nil
        end
      end
      if #gone > 0 then redis.call('HDEL', fkey, unpack(gone)) end
      me = shares[kname] or {tat = 0, seen = 0, w = 1, wants = 0}
      me.seen, me.w = now, weight
      local others = 0
      for _, name in ipairs(names) do
        local c = shares[name]
        if c and name ~= kname and c.wants == 1 and c.seen >= since then others = others + c.w end
      end
      share = weight / (weight + others)
    end
    local kT, kb = T / share, math.max(1, b * share)
    if not partial then kb = math.max(kb, n) end
    local ktat = now
    if me then ktat = math.max(me.tat, now) end
    if share < 1 then avail = math.min(avail, math.floor((kb * kT - (ktat - now) + 1e-6) / kT)) end
    local function keep_key()
      redis.call('HSET', fkey, kname, fmt(me.tat) .. ' ' .. fmt(me.seen) .. ' ' .. fmt(me.w) .. ' ' .. tostring(me.wants))
      redis.call('PEXPIRE', fkey, ttl_ms)
    end
    if partial then k = math.min(n, avail) elseif avail < n then k = 0 end
    if k < 1 then
      local need = n
      if partial then need = 1 end
      if me then
        me.wants = 1
        keep_key()
      end
      if need > b then
        return reply('0', 'inf', 'wait')
      end
      wait = math.max(tat + need * T - b * T - now, 0.000001)
      if share < 1 then wait = math.max(wait, ktat + need * kT - kb * kT - now) end
      return reply('0', fmt(wait), 'wait')
    end
    s.tat = tat + k * T
    wait = math.max(0, s.tat + T - b * T - now)
    if me then
      -- a key borrowing idle shares owes at most its share's burst
      me.tat = math.min(ktat + k * kT, now + kb * kT)
      if k < n then me.wants = 1 else me.wants = 0 end
      keep_key()
      if share < 1 then wait = math.max(wait, me.tat + kT - kb * kT - now) end
    end
  end
  if s.used < 0 then s.used, s.used_at = s.rate * use_window, now end
  s.used = s.used * math.exp(-math.max(0, now - s.used_at) / use_window) + k
  s.used_at = now
  if verdict == 'probe' then
    s.c_probe = now + probe_lease
    save({'tat', 'used', 'used_at', 'c_probe'})
  else
    save({'tat', 'used', 'used_at'})
  end
  return reply(tostring(k), fmt(wait), verdict)
elseif op == 'pause' then
  local pause_s, cut_ver = tonumber(ARGV[7]), tonumber(ARGV[8])
  local dec, ss_dec = tonumber(ARGV[9]), tonumber(ARGV[10])
  local min_rps, start_rps = tonumber(ARGV[11]), tonumber(ARGV[12])
  local cut = 0
  local old = s.rate
  if cut_ver >= 0 and cut_ver == s.ver then
    cut = 1
    s.ver = s.ver + 1
    s.ev, s.ev_at, s.ev_acc = s.ev + 1, now, s.acc
    if s.rate <= 0 then
      s.rate, s.ss = math.max(start_rps, used_rps() * ss_dec), 1
    else
      local d = dec
      if s.ss == 1 then d = ss_dec end
      s.ss, s.ref = 0, s.rate
      s.rate = math.max(min_rps, s.rate * d)
    end
  end
  rescale(old)
  s.pause = math.max(s.pause, now + pause_s)
  if s.rate > 0 then s.tat = math.max(s.tat, s.pause + burst() / s.rate) end
  save()
  return state({tostring(cut), fmt(s.pause - now)})
elseif op == 'grow' then
  local add, mul = tonumber(ARGV[7]), tonumber(ARGV[8])
  local max_rps, in_use = tonumber(ARGV[9]), tonumber(ARGV[10])
  local grown = 0
  if s.rate > 0 and used_rps() >= in_use * s.rate then
    local rate = s.rate * mul + add
    if max_rps > 0 then rate = math.min(rate, max_rps) end
    if rate ~= s.rate then grown = 1 end
    local old = s.rate
    s.rate = rate
    rescale(old)
    save()
  end
  return state({tostring(grown)})
elseif op == 'set' then
  local old = s.rate
  s.rate, s.ref, s.ss, s.ver = tonumber(ARGV[7]), tonumber(ARGV[7]), tonumber(ARGV[8]), s.ver + 1
  rescale(old)
  save()
  return state({})
elseif op == 'record' then
  local answered, unavailable = tonumber(ARGV[7]), tonumber(ARGV[8])
  local threshold, open_s, open_max = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
  local opened = 0
  if answered > 0 then
    s.c_fail, s.c_open, s.c_period, s.c_probe = 0, 0, 0, 0
  elseif unavailable <= 0 then
    s.c_probe = 0
  else
    s.c_fail = s.c_fail + unavailable
    if s.c_open > 0 and now >= s.c_open then
      s.c_period = math.min(open_max, math.max(open_s, 2 * s.c_period))
      opened = 1
    elseif s.c_open == 0 and threshold > 0 and s.c_fail >= threshold then
      s.c_period = open_s
      opened = 1
    end
    if opened == 1 then s.c_open, s.c_probe = now + s.c_period, 0 end
  end
  save()
  local left = 0
  if s.c_open > now then left = s.c_open - now end
  return state({tostring(opened), fmt(left)})
elseif op == 'learn' then
  local n, holder, lease_ms = tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
  local rate, in_use = tonumber(ARGV[10]), tonumber(ARGV[15])
  s.acc = s.acc + n
  local leader = 0
  if holder ~= '' then
    local cur = redis.call('GET', lkey)
    if not cur then
      redis.call('SET', lkey, holder, 'PX', lease_ms)
      leader = 1
    elseif cur == holder then
      redis.call('PEXPIRE', lkey, lease_ms)
      leader = 1
    end
  end
  if leader == 1 and rate >= 0 then
    local old = s.rate
    s.rate, s.ss = rate, tonumber(ARGV[11])
    s.lim, s.ph, s.cuts = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
    if s.lim > 0 then s.ref = s.lim end
    rescale(old)
    save()
  elseif n > 0 or fresh then
    save({'acc'})
  end
  local busy = 0
  if s.rate > 0 and used_rps() >= in_use * s.rate then busy = 1 end
  return state({tostring(leader), fmt(s.acc), tostring(s.ev), fmt(now - s.ev_at), fmt(s.ev_acc),
                fmt(s.pause - now), tostring(busy), fmt(s.lim), tostring(s.ph), tostring(s.cuts)})
elseif op == 'rejoin' then
  local spent, pause_s, rate = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
  local away, share, since = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
  local away_s = tonumber(ARGV[13])
  if rate > 0 and (s.rate <= 0 or rate < s.rate) then
    local old = s.rate
    s.rate, s.ss, s.ver = rate, 0, s.ver + 1
    rescale(old)
  end
  if s.rate > 0 and spent > 0 then s.tat = math.max(s.tat, now) + spent / s.rate end
  if pause_s > 0 then
    s.pause = math.max(s.pause, now + pause_s)
    if s.rate > 0 then s.tat = math.max(s.tat, s.pause + burst() / s.rate) end
  end
  if s.aw_at > 0 and now - since <= s.aw_at then
    if s.aw_until > now and s.aw_n > 0 then s.aw_n = s.aw_n - 1 end
  elseif away > 0 then
    s.aw_n, s.aw_share, s.aw_at, s.aw_until = away, share, now, now + away_s
  end
  save()
  return state({})
elseif op == 'state' then
  local left = 0
  if s.pause > now then left = s.pause - now end
  return state({fmt(left), fmt(used_rps())})
end
return redis.error_reply('unknown pacer op ' .. tostring(op))
