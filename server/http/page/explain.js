// The explanation page's script (served at / by qvi-server's HTTP port; docs/serving.md, "The explanation
// page"). It calls the same JSON routes any client calls, with relative URLs (so the page works behind a
// path prefix), and builds every element with textContent: a text or a model's card is never parsed as
// HTML. Test hooks: body[data-state] is loading, ready, busy, answered or error; #errors collects script
// errors and offset mismatches.
(function () {
  'use strict';
  window.addEventListener('error', function (e) { scriptError('script error: ' + e.message); });
  window.addEventListener('unhandledrejection', function (e) { scriptError('unhandled: ' + e.reason); });

  var $ = function (id) { return document.getElementById(id); };
  var models = {};  // 'name@version' -> {name, version, md}
  var RED = '220, 38, 38', BLUE = '37, 99, 235', GREEN = '22, 163, 74', PURPLE = '124, 58, 237';
  var TEAL = '13, 148, 136', MAGENTA = '192, 38, 211';

  function scriptError(message) {
    $('errors').textContent += message + '\n';
    document.documentElement.setAttribute('data-script-errors', 'yes');
  }

  function setState(s) { document.body.setAttribute('data-state', s); }

  function fixed(v, digits) { return Number(v).toFixed(digits); }

  // el('span', {className: 'tok', 'data-index': 3}, 'text' or [children])
  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === 'className') e.className = attrs[k];
      else e.setAttribute(k, String(attrs[k]));
    });
    if (children === undefined || children === null) return e;
    (Array.isArray(children) ? children : [children]).forEach(function (c) {
      if (c !== null && c !== undefined) e.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    });
    return e;
  }

  // The API key, when the server wants one (qvi-server --api-keys): typed into the key row, which shows
  // after a 401, and kept for this tab only (sessionStorage), never in the URL.
  function apiKey() { try { return sessionStorage.getItem('qvi-api-key') || ''; } catch (e) { return ''; } }

  function askForKey(message) {
    $('key-row').hidden = false;
    $('key-note').textContent = message;
    $('api-key').focus();
  }

  async function call(url, body) {
    var headers = body === undefined ? {} : {'Content-Type': 'application/json'};
    if (apiKey()) headers['Authorization'] = 'Bearer ' + apiKey();
    var init = body === undefined ? {headers: headers} : {method: 'POST', headers: headers, body: JSON.stringify(body)};
    var r = await fetch(url, init);
    var data = null;
    try { data = await r.json(); } catch (e) { /* not JSON: reported below */ }
    if (r.status === 401) {
      askForKey(apiKey() ? 'The server did not take this key: ' + (data && data.error ? data.error : '')
                         : 'This server wants an API key.');
    }
    if (!r.ok) throw new Error('HTTP ' + r.status + ': ' + (data && data.error ? data.error : r.statusText));
    if (data === null) throw new Error('HTTP ' + r.status + ': the answer was not JSON');
    return data;
  }

  function modelPath(m) {
    return 'v1/models/' + encodeURIComponent(m.name) + '/versions/' + m.version;
  }

  // --- the model card -------------------------------------------------------------------------------
  function hasOutput(md, pattern) {
    return (md.outputs || []).some(function (o) { return pattern.test(o.name); });
  }

  function faithHeading(f) {
    if (!f || !f.measured) return 'faithfulness: ' + ((f && f.note) || 'not measured');
    var split = (f.split || '').split('/').pop();
    return 'faithfulness on ' + split + ': ' + f.answers + ' answers in ' + f.texts + ' texts, tokens ' +
        (f.removal === 'pad' ? 'replaced by [PAD]' : 'deleted') + ', ' + f.target +
        (f.costMachine ? '; costs measured on ' + f.costMachine : '');
  }

  function interval(e, digits) {
    return e ? fixed(e.mean, digits) + ' [' + fixed(e.low, digits) + ', ' + fixed(e.high, digits) + ']' : '–';
  }

  function faithTable(f) {
    var head = el('tr', {}, ['method', 'comprehensiveness AOPC [95 % CI]', 'minus random', 'sufficiency',
      'leave-one-out ρ', 'ms per text alone / in batches of 32', 'extra forwards per text'].map(
      function (h) { return el('th', {}, h); }));
    var rows = (f.methods || []).map(function (m) {
      var vs = m.method === 'random' ? 'the floor' : (m.vsRandom ? interval(m.vsRandom, 3) : '–');
      var c = m.cost;
      // proto3 JSON leaves out zeros, so a present cost with an absent field is 0
      var ms = c ? fixed(c.msPerTextBatch1 || 0, 2) + ' / ' + fixed(c.msPerTextBatch32 || 0, 2) : '–';
      var forwards = c ? '+' + fixed(c.extraForwardsPerText || 0, 1) : '–';
      return el('tr', {'data-method': m.method}, [el('td', {}, m.name), el('td', {}, interval(m.comprehensiveness, 3)),
        el('td', {}, vs), el('td', {}, m.sufficiency ? fixed(m.sufficiency.mean, 3) : '–'),
        el('td', {}, m.looSpearman ? fixed(m.looSpearman.mean, 2) : '–'), el('td', {className: 'cost'}, ms),
        el('td', {className: 'forwards'}, forwards)]);
    });
    return el('table', {className: 'faith', id: 'faithfulness-table'}, [head].concat(rows));
  }

  // What the card says the model scored on its test split ("accuracy 79.2 %, macro F1 78.3 %"), or ''.
  function testScores(md) {
    var test;
    try { test = ((JSON.parse(md.modelCardJson || '{}').metrics) || {}).test; } catch (e) { return ''; }
    if (!test) return '';
    var names = {accuracy: 'accuracy', macro_f1: 'macro F1', f1: 'F1', precision: 'precision', recall: 'recall'};
    return Object.keys(names).filter(function (k) { return typeof test[k] === 'number'; }).map(function (k) {
      return names[k] + ' ' + fixed(100 * test[k], 1) + ' %';
    }).join(', ');
  }

  // --- how far to trust a score: the card's calibration (docs/serving.md, "How far to trust a score") ----
  function calibrationOf(md) {
    try { return JSON.parse(md.modelCardJson || '{}').calibration; } catch (e) { return undefined; }
  }

  function svg(tag, attrs) {
    var e = document.createElementNS('http://www.w3.org/2000/svg', tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    return e;
  }

  // The reliability diagram: each bin's accuracy against its mean confidence, before (grey) and after
  // (blue) calibration, a dot's area its share of the answers; calibrated dots sit on the diagonal.
  function reliabilityDiagram(c) {
    var size = 200, pad = 24, plot = svg('svg', {id: 'reliability', width: size + 2 * pad, height: size + 2 * pad,
      viewBox: '0 0 ' + (size + 2 * pad) + ' ' + (size + 2 * pad), role: 'img'});
    var x = function (v) { return pad + v * size; }, y = function (v) { return pad + (1 - v) * size; };
    plot.appendChild(svg('rect', {x: pad, y: pad, width: size, height: size, fill: 'none', stroke: '#999'}));
    plot.appendChild(svg('line', {x1: x(0), y1: y(0), x2: x(1), y2: y(1), stroke: '#999', 'stroke-dasharray': '4 3'}));
    [['before', '#9ca3af'], ['after', '#2563eb']].forEach(function (side) {
      var points = (c[side[0]] || {}).reliability || [];
      var total = points.reduce(function (n, q) { return n + q[3]; }, 0) || 1;
      points.forEach(function (q) {
        plot.appendChild(svg('circle', {cx: x(q[1]), cy: y(q[2]), r: 2 + 10 * Math.sqrt(q[3] / total), fill: side[1],
          'fill-opacity': 0.7, 'data-side': side[0], 'data-confidence': q[1], 'data-accuracy': q[2]}));
      });
    });
    var label = svg('text', {x: pad, y: size + 2 * pad - 6, 'font-size': 11});
    label.textContent = 'confidence →  (up: how often right)';
    plot.appendChild(label);
    return plot;
  }

  // The risk-coverage curve of the card's abstention table: for each threshold, the share of the test split
  // still answered against the accuracy of those answers (a tagger's: its entities' precision).
  function riskCoverage(c) {
    var rows = (c.abstention || []).filter(function (r) { return typeof r.accuracy === 'number'; });
    if (!rows.length) return null;
    var low = Math.min(0.9, Math.max(0, Math.floor(10 * Math.min.apply(null, rows.map(function (r) {
      return r.accuracy; }))) / 10));
    var size = 200, pad = 24, plot = svg('svg', {id: 'risk-coverage', width: size + 2 * pad, height: size + 2 * pad,
      viewBox: '0 0 ' + (size + 2 * pad) + ' ' + (size + 2 * pad), role: 'img'});
    var x = function (v) { return pad + v * size; }, y = function (v) { return pad + (1 - (v - low) / (1 - low)) * size; };
    plot.appendChild(svg('rect', {x: pad, y: pad, width: size, height: size, fill: 'none', stroke: '#999'}));
    plot.appendChild(svg('polyline', {fill: 'none', stroke: '#2563eb', points: rows.map(function (r) {
      return x(1 - r.abstained) + ',' + y(r.accuracy); }).join(' ')}));
    rows.forEach(function (r) {
      var dot = svg('circle', {cx: x(1 - r.abstained), cy: y(r.accuracy), r: 3, fill: '#2563eb', 'data-below': r.below,
        'data-answered': 1 - r.abstained, 'data-accuracy': r.accuracy});
      var title = svg('title', {});
      title.textContent = 'below ' + r.below + ': ' + fixed(100 * (1 - r.abstained), 1) + ' % answered, ' +
        fixed(100 * r.accuracy, 1) + ' % right';
      dot.appendChild(title);
      plot.appendChild(dot);
    });
    var label = svg('text', {x: pad, y: size + 2 * pad - 6, 'font-size': 11});
    label.textContent = 'answered →  (up: right, from ' + fixed(low, 1) + ')';
    plot.appendChild(label);
    return plot;
  }

  function calibrationBlock(md) {
    var c = calibrationOf(md);
    if (!c) {
      return el('details', {className: 'calibration', id: 'calibration'},
        [el('summary', {}, 'scores: the raw softmax (the card has no calibration)')]);
    }
    var b = c.before || {}, a = c.after || {};
    var block = el('details', {className: 'calibration', id: 'calibration', open: ''}, [el('summary', {},
      'scores calibrated on ' + c.fitted_on + ' (T ' + fixed(c.temperature, 2) + '): ECE ' + fixed(b.ece, 3) + ' → ' +
      fixed(a.ece, 3) + ', Brier ' + fixed(b.brier, 3) + ' → ' + fixed(a.brier, 3) + ' on ' + c.measured_on)]);
    block.appendChild(reliabilityDiagram(c));
    var curve = riskCoverage(c);
    if (curve) block.appendChild(curve);
    var lines = (c.conformal || []).map(function (l) {
      return el('li', {'data-coverage': l.coverage_target}, 'coverage ' + l.coverage_target + ': labels at p ≥ ' +
        fixed(l.min_probability, 4) + ' covered ' + fixed(100 * l.coverage, 1) + ' % of the test split, ' +
        fixed(l.mean_set_size, 2) + ' labels a set');
    });
    if (lines.length) block.appendChild(el('ul', {id: 'conformal'}, lines));
    // Where the test split's coverage fell short of a target beyond sampling error, the card says why.
    if (c.note) block.appendChild(el('p', {className: 'note', id: 'calibration-note'}, c.note));
    block.appendChild(el('p', {className: 'note'}, 'Left: of the answers given about 0.8, about 80 % were right on ' +
        'the test split, grey before calibration, blue after. Right: abstaining below each threshold, the share of ' +
        'the test split still answered against how often those answers were right. Ask for a label set with ' +
        '"coverage", or mark unsure answers with "abstain_below".'));
    return block;
  }

  function renderCard(m) {
    var md = m.md, card = $('card');
    card.textContent = '';
    var facts = [['task', md.task], ['architecture', md.displayName + ' (' + md.architecture + '), interaction ' +
        md.interaction], md.task === 'classification' ? ['labels', (md.labels || []).join(', ')]
        : ['entities', (md.entityTypes || []).join(', ') + ' (' + md.tagScheme + ' tags)'],
    ['tokenizer', md.tokenizer ? md.tokenizer.level + ' level' +
        (md.tokenizer.kind ? ' (' + md.tokenizer.kind + ')' : '') + ', ' + (md.tokenizer.lowercase ? 'lower-cased, ' : '') +
        'up to ' + md.tokenizer.maxTokens + ' tokens' : ''],
    ['layers × heads', md.layers ? md.layers + ' × ' + md.heads : 'no self-attention'],
    ['runs on', md.device + ' from ' + md.format], ['on its test split', testScores(md)]];
    var dl = el('dl', {});
    facts.forEach(function (f) {
      if (f[0] === 'on its test split' && !f[1]) return;
      dl.appendChild(el('dt', {}, f[0]));
      dl.appendChild(el('dd', {'data-fact': f[0]}, f[1] || ''));
    });
    card.appendChild(el('h2', {}, 'Model card: ' + m.name + ' version ' + m.version));
    card.appendChild(el('p', {id: 'description'}, md.description || ''));
    card.appendChild(dl);
    var f = md.faithfulness;
    var faith = el('details', {className: 'faithfulness', id: 'faithfulness', open: ''},
      [el('summary', {}, faithHeading(f))]);
    if (f && f.measured) {
      faith.appendChild(faithTable(f));
      faith.appendChild(el('p', {className: 'note'}, 'How much the answer\'s probability falls when the tokens a ' +
          'method ranks highest are deleted (comprehensiveness, higher is more faithful), compared with deleting ' +
          'random tokens; sufficiency is the fall when only those tokens are kept (lower is better).'));
    }
    card.appendChild(faith);
    card.appendChild(calibrationBlock(md));
    var raw = el('details', {}, [el('summary', {}, 'the whole model card (JSON)')]);
    var json = md.modelCardJson || '{}';
    try { json = JSON.stringify(JSON.parse(json), null, 2); } catch (e) { /* shown as it came */ }
    raw.appendChild(el('pre', {id: 'model-card-json'}, json));
    card.appendChild(raw);
  }

  function selected() { return models[$('model').value]; }

  function onModel() {
    var m = selected();
    if (!m) return;
    var md = m.md;
    var gates = hasOutput(md, /gate|lambda/), layers = md.layers > 0 && hasOutput(md, /^layer_/);
    var classify = md.task === 'classification', contributions = hasOutput(md, /^contribution$/);
    [['want-gates', gates], ['want-layers', layers], ['heads', layers], ['want-check', classify],
      ['want-contributions', contributions], ['want-occlusion', true]].forEach(
      function (x) {
        $(x[0]).disabled = !x[1];
        $(x[0]).parentElement.classList.toggle('off', !x[1]);
      });
    renderCard(m);
    $('answer').textContent = '';
    history.replaceState(null, '', '#model=' + encodeURIComponent($('model').value));
  }

  async function loadModels() {
    var list = await call('v1/models');
    var select = $('model');
    select.textContent = '';
    (list.models || []).forEach(function (info) {
      (info.versions || []).forEach(function (v) {
        if (v.state !== 'MODEL_STATE_READY') return;
        var key = info.name + '@' + v.version;
        models[key] = {name: info.name, version: v.version, md: v.metadata};
        select.appendChild(el('option', {value: key}, key + ' · ' + v.metadata.displayName + ' (' + v.metadata.task +
            ')'));
      });
    });
    if (select.options.length === 0) throw new Error('no model version is ready on this server');
    var wanted = decodeURIComponent((location.hash.match(/model=([^&]*)/) || [])[1] || '');
    var match = Object.keys(models).filter(function (k) { return k === wanted || k.split('@')[0] === wanted; });
    if (match.length) select.value = match[0];
    select.disabled = false;
    $('explain').disabled = false;
    onModel();
  }

  // --- the answer -----------------------------------------------------------------------------------
  function tokenInfo(t) {
    var info = '"' + t.text + '" [' + t.start + ',' + t.end + ')';
    if (t.tag) info += '  tag ' + t.tag;
    if (t.attention !== undefined) info += '  α=' + fixed(t.attention, 4);
    if (t.gate !== undefined) info += '  β=' + fixed(t.gate, 4);
    if (t.lambdaQ !== undefined) info += '  λq=' + fixed(t.lambdaQ, 4) + ' λk=' + fixed(t.lambdaK, 4);
    if (t.sentenceAttention !== undefined) info += '  sentence α=' + fixed(t.sentenceAttention, 4);
    if (t.contribution && t.contribution.length) info += '  contribution=' + fixed(t.contribution[0], 4);
    if (t.occlusion && t.occlusion.length) info += '  occlusion=' + fixed(t.occlusion[0], 4);
    if (t.subwords && t.subwords.length) info += '  sub-words ' + t.subwords.join(' ');
    return info;
  }

  function tok(t, value, shade, rgb, info) {
    var e = el('span', {className: 'tok', tabindex: -1, 'data-value': fixed(value, 4), 'data-start': t.start,
      'data-end': t.end, 'data-info': info, 'aria-label': info}, t.text);
    e.style.background = 'rgba(' + rgb + ', ' + fixed(Math.min(1, Math.max(0, shade)), 3) + ')';
    return e;
  }

  // One heat-map row over the tokens; get(t, i) is the weight, or undefined when the token has none.
  function heatRow(tokens, kind, title, rgb, scaleToMax, get) {
    var values = tokens.map(get);
    if (!values.some(function (v) { return v !== undefined; })) return null;
    var max = Math.max.apply(null, values.map(function (v) { return v || 0; }));
    var toks = el('span', {className: 'toks', dir: 'auto'}, tokens.map(function (t, i) {
      var v = values[i] || 0;
      return tok(t, v, scaleToMax && max > 0 ? v / max : v, rgb, title + ' ' + fixed(v, 4) + ' · ' + tokenInfo(t));
    }));
    var row = el('div', {className: 'row heat', 'data-kind': kind, role: 'group', 'aria-label': title},
      [el('span', {className: 'row-title'}, title), toks]);
    roving(toks, Array.prototype.slice.call(toks.children), 0);
    return row;
  }

  // The card's figure for a method ("comprehensiveness 0.396, 2.6× α"), or '' when it has none.
  // The card's comprehensiveness for a method; undefined when it has none.
  // Cards measured before the served methods name them by their offline twins (same values).
  var OLDER = {contribution: 'alpha_value', occlusion: 'leave_one_out'};
  function cardScore(md, method) {
    var f = md.faithfulness, found, older;
    ((f && f.measured && f.methods) || []).forEach(function (m) {
      if (m.method === method) found = m.comprehensiveness.mean;
      if (m.method === OLDER[method]) older = m.comprehensiveness.mean;
    });
    return found !== undefined ? found : older;
  }

  function figure(md, method) {
    var alpha = cardScore(md, 'alpha'), found = cardScore(md, method);
    if (found === undefined) return '';
    return 'comprehensiveness ' + fixed(found, 3) + (alpha > 0 && method !== 'alpha' ? ', ' + fixed(found / alpha, 1) +
        '× α' : '');
  }

  // options.contributions: per returned label, each token's signed share of the label's margin; teal
  // for, magenta against, scaled to the row's largest share. First on the page: the card measures it as
  // the most faithful of the served explanations (its "contribution" row is the best label's).
  function contributionRows(md, r) {
    var tokens = r.tokens || [], rows = [];
    (r.labels || []).forEach(function (l, j) {
      if (l.margin === undefined) return;
      var fig = j === 0 ? figure(md, 'contribution') : '';
      rows.push(signedRow(tokens, 'contribution', 'contribution to ' + l.label + (fig ? ' (' + fig + ')' : ''),
        tokens.map(function (t) { return (t.contribution || [])[j] || 0; }), ' margin ' + fixed(l.margin, 3) +
        ' = tokens + rest ' + fixed(l.contributionRest || 0, 3), {'data-label': l.label}, 0, 0));
    });
    if (rows.length) {
      rows.push(el('p', {className: 'note'}, 'Contribution: each token\'s exact, signed share of the label\'s logit ' +
          'margin over the other labels (teal for the label, magenta against it), from the same forward pass; the ' +
          'tokens\' shares and the rest (the output layer\'s bias) add up to the margin.'));
    }
    return rows;
  }

  // One row of signed values over the tokens, teal for (positive), magenta against, scaled to the row's
  // largest; tokens [skipStart, skipEnd) (an entity's own) are left unshaded.
  function signedRow(tokens, kind, title, values, note, attrs, skipStart, skipEnd) {
    var largest = Math.max.apply(null, [1e-12].concat(values.map(Math.abs)));
    var toks = el('span', {className: 'toks', dir: 'auto'}, tokens.map(function (t, i) {
      var own = i >= skipStart && i < skipEnd, v = own ? 0 : values[i] || 0;
      var info = own ? title + ': part of the entity · ' + tokenInfo(t) :
        title + ' ' + (v >= 0 ? '+' : '') + fixed(v, 4) + ' · ' + tokenInfo(t);
      var e = tok(t, v, Math.abs(v) / largest, v >= 0 ? TEAL : MAGENTA, info);
      e.setAttribute('data-share', fixed(v, 6));
      if (own) e.classList.add('own');
      return e;
    }));
    var a = {className: 'row heat ' + kind, 'data-kind': kind.split(' ').pop(), role: 'group', 'aria-label': title};
    Object.keys(attrs || {}).forEach(function (k) { a[k] = attrs[k]; });
    var row = el('div', a, [el('span', {className: 'row-title'}, title), toks].concat(note ? [el('span',
      {className: 'note'}, note)] : []));
    roving(toks, Array.prototype.slice.call(toks.children), 0);
    return row;
  }

  // options.occlusion of a classifier: per returned label, how much its probability drops without each
  // token (leave-one-out, n more forwards).
  function occlusionRows(md, r) {
    var tokens = r.tokens || [], rows = [];
    (r.labels || []).forEach(function (l, j) {
      if (!tokens.length || !tokens.every(function (t) { return (t.occlusion || []).length > j; })) return;
      var fig = j === 0 ? figure(md, 'occlusion') : '';
      rows.push(signedRow(tokens, 'occlusion', 'occlusion of ' + l.label + (fig ? ' (' + fig + ')' : ''),
        tokens.map(function (t) { return t.occlusion[j]; }), ' p ' + fixed(l.score, 3), {'data-label': l.label}, 0, 0));
    });
    if (rows.length) {
      rows.push(el('p', {className: 'note'}, 'Occlusion: how much the label\'s probability drops when the token is ' +
          'deleted and the text is read again (teal: the label needs it; magenta: it gains without it).'));
    }
    return rows;
  }

  // options.occlusion of a tagger: one row per entity, how much its probability (the mean CRF marginal
  // of its tags) drops without each token around it; the row of the entity last clicked is shown.
  function entityRows(md, r) {
    var tokens = r.tokens || [], spans = r.spans || [];
    if (!spans.some(function (s) { return s.probability !== undefined; })) return [];
    var fig = figure(md, 'occlusion');
    var rows = spans.map(function (s, k) {
      var start = s.tokenStart || 0, row = signedRow(tokens, 'occlusion entity-occlusion', 'why ' + s.label + ' "' +
          s.text + '"' + (fig ? ' (' + fig + ')' : ''), (s.occlusion || []).slice(), ' p ' + fixed(s.probability || 0, 3),
        {'data-entity': k, 'data-label': s.label}, start, s.tokenEnd);
      if (k > 0) row.hidden = true;
      return row;
    });
    return [el('div', {id: 'entity-why'}, rows), el('p', {className: 'note'}, 'Click an entity to see why it was ' +
        'found: how much its probability drops when each other token is deleted and the text is tagged again ' +
        '(teal: the entity needs it; magenta: it gains without it).')];
  }

  // Shows entity k's occlusion row, hides the others.
  function showEntity(k) {
    var rows = document.querySelectorAll('#entity-why .entity-occlusion');
    Array.prototype.forEach.call(rows, function (row) { row.hidden = row.getAttribute('data-entity') !== String(k); });
    Array.prototype.forEach.call(document.querySelectorAll('mark.ent'), function (m) {
      m.setAttribute('aria-pressed', m.getAttribute('data-entity') === String(k) ? 'true' : 'false');
    });
  }

  function heatmaps(md, tokens) {
    var fig = figure(md, 'alpha');
    var rows = [
      heatRow(tokens, 'alpha', 'α attention' + (fig ? ' (' + fig + ')' : ''), RED, true, function (t) { return t.attention; }),
      heatRow(tokens, 'beta', 'β gate', BLUE, false, function (t) { return t.gate; }),
      heatRow(tokens, 'sentence-alpha', 'sentence α', RED, true, function (t) { return t.sentenceAttention; }),
      heatRow(tokens, 'sentence-beta', 'sentence β', BLUE, false, function (t) { return t.sentenceGate; }),
      heatRow(tokens, 'lambda-q', 'λ_Q', GREEN, false, function (t) { return t.lambdaQ; }),
      heatRow(tokens, 'lambda-k', 'λ_K', GREEN, false, function (t) { return t.lambdaK; })
    ].filter(function (r) { return r !== null; });
    if (rows.length) {
      rows.push(el('p', {className: 'note'}, 'What they measure: α is how much the pooling reads each token when it ' +
          'forms the vector the answer comes from (eq. 4), scaled to the text\'s largest weight; β is the QVI gate, ' +
          'how much of the token\'s own value passes into what is read (eq. 5, in (0, 1)); λ the context-aware ' +
          'gates. Neither is the token\'s effect on the answer: contribution and occlusion are, and the model card ' +
          'measures how far each ranking agrees with the answer. Hover or focus a token for its numbers.'));
    }
    return rows;
  }

  // The answer's explanation rows, the methods the card measures as most faithful first (its
  // comprehensiveness; a method it has not measured goes after those it has, in the order given).
  function ordered(md, groups) {
    var score = function (g) {
      var found = cardScore(md, g.method);
      return found === undefined ? -1 : found;
    };
    return groups.map(function (g, i) { return {g: g, s: score(g), i: i}; }).sort(function (a, b) {
      return b.s - a.s || a.i - b.i;
    }).reduce(function (out, x) { return out.concat(x.g.rows); }, []);
  }

  function mapCaption(m) {
    return (m.layer < 0 ? 'all layers' : 'layer ' + m.layer) + ', ' + (m.head < 0 ? 'mean of heads' : 'head ' + m.head);
  }

  function attentionMap(tokens, m) {
    var n = tokens.length, max = 1e-9;
    m.attention.forEach(function (a) { max = Math.max(max, a); });
    var head = el('tr', {}, [el('th', {})].concat(tokens.map(function (t) { return el('th', {className: 'col'}, t.text); })));
    var cells = [], rows = [head];
    for (var q = 0; q < n; q++) {
      var tds = [];
      for (var k = 0; k < n; k++) {
        var a = m.attention[q * n + k], info = mapCaption(m) + ': ' + tokens[q].text + ' → ' + tokens[k].text + '  ' +
            fixed(a, 4);
        var td = el('td', {tabindex: -1, 'data-value': fixed(a, 4), 'data-info': info, 'aria-label': info});
        td.style.background = 'rgba(' + PURPLE + ', ' + fixed(Math.min(1, a / max), 3) + ')';
        tds.push(td);
      }
      cells = cells.concat(tds);
      rows.push(el('tr', {}, [el('th', {}, tokens[q].text)].concat(tds)));
    }
    var table = el('table', {className: 'map', 'data-layer': m.layer, 'data-head': m.head}, rows);
    roving(table, cells, n);
    return el('figure', {}, [el('figcaption', {}, mapCaption(m)), table]);
  }

  function layerMaps(tokens, maps) {
    var n = tokens.length, out = [];
    var withMaps = maps.filter(function (m) { return m.attention && m.attention.length === n * n && n > 0; });
    if (withMaps.length) {
      out.push(el('h3', {}, 'Self-attention maps'));
      out.push(el('p', {className: 'note'}, 'Row: the query token; column: the key token it attends to. Darker is ' +
          'more attention, scaled to each map\'s largest weight. Arrow keys move between cells.'));
      out.push(el('div', {className: 'maps'}, withMaps.map(function (m) { return attentionMap(tokens, m); })));
    }
    var gateRows = [];
    maps.forEach(function (m) {
      [['gates', 'β', BLUE], ['lambdaQ', 'λ_Q', GREEN], ['lambdaK', 'λ_K', GREEN]].forEach(function (g) {
        var v = m[g[0]];
        if (!v || v.length !== n || n === 0) return;
        var title = g[1] + ' L' + m.layer + (m.head < 0 ? '' : ' h' + m.head);
        var r = heatRow(tokens, 'layer-' + g[0], title, g[2], false,
          function (t, i) { return v[i]; });
        if (r) gateRows.push(r);
      });
    });
    if (gateRows.length) {
      out = out.concat([el('h3', {}, 'Gates per layer'), el('p', {className: 'note'}, 'L: the layer, h: the head ' +
          '(none: the mean of the heads).')], gateRows);
    }
    return out;
  }

  // The text with its entities marked, cut by code points (what Span.start/end count), so that
  // right-to-left scripts, CJK and characters outside the BMP keep their places.
  function markedText(text, spans) {
    var cps = Array.from(text), at = 0, parts = [];
    spans.forEach(function (s, k) {
      if (s.start < at || s.end > cps.length || s.start > s.end) return;
      var shown = cps.slice(s.start, s.end).join('');
      if (shown !== s.text) scriptError('span offsets [' + s.start + ',' + s.end + ') cut "' + shown + '", not "' + s.text + '"');
      var info = s.label + ' ' + fixed(s.score, 3) + ' [' + s.start + ',' + s.end + ')';
      parts.push(cps.slice(at, s.start).join(''));
      parts.push(el('mark', {className: 'ent', tabindex: 0, role: 'button', 'data-entity': k, 'data-label': s.label,
        'data-start': s.start, 'data-end': s.end, 'data-info': info, 'aria-label': info},
        [shown, el('span', {className: 'ent-label'}, s.label)]));
      at = s.end;
    });
    parts.push(cps.slice(at).join(''));
    return el('p', {className: 'source spans', dir: 'auto'}, parts);
  }

  function checkTokens(text, tokens) {
    var cps = Array.from(text);
    tokens.forEach(function (t) {
      var shown = cps.slice(t.start, t.end).join('');
      if (shown !== t.text) scriptError('token offsets [' + t.start + ',' + t.end + ') cut "' + shown + '", not "' + t.text + '"');
    });
  }

  function labels(r) {
    return el('p', {className: 'labels'}, r.labels.map(function (l, i) {
      var bar = el('span', {className: 'bar'});
      bar.style.width = fixed(l.score * 8, 2) + 'em';
      return el('span', {className: 'label' + (i === 0 ? ' top' : ''), 'data-label': l.label, 'data-score': fixed(l.score, 4)},
        [l.label + ' ' + fixed(l.score, 3), bar]);
    }));
  }

  function faithCheck(r) {
    var c = r.faithfulness;
    if (!c || !c.label) return null;
    var removed = (c.removed || []).map(function (i) { return r.tokens[i] ? r.tokens[i].text : '#' + i; });
    return el('p', {className: 'check', id: 'check'}, 'With α\'s top ' + removed.length + ' tokens deleted (' +
        removed.join(', ') + '): p(' + c.label + ') ' + fixed(c.score, 3) + ' → ' + fixed(c.scoreWithout || 0, 3) + '.');
  }

  function renderAnswer(m, text, answer, ms) {
    var r = answer.results[0], out = $('answer');
    checkTokens(text, r.tokens || []);
    var parts = [el('h2', {}, 'Answer'), el('p', {className: 'meta', id: 'answered-by'}, m.name + ' version ' +
        answer.model.version + ' answered in ' + fixed(ms, 1) + ' ms (request ' + answer.requestId + ').')];
    if (m.md.task === 'classification') {
      parts.push(labels(r));
      parts.push(faithCheck(r));
    } else {
      parts.push(markedText(text, r.spans || []));
      if (!(r.spans || []).length) parts.push(el('p', {className: 'note'}, 'No entities.'));
    }
    if (r.truncated) parts.push(el('p', {className: 'note'}, 'Truncated: the model read the first ' +
        (r.tokens || []).length + ' tokens of ' + r.numTokens + '.'));
    var classify = m.md.task === 'classification';
    parts = parts.concat(ordered(m.md, [
      {method: 'contribution', rows: classify ? contributionRows(m.md, r) : []},
      {method: 'occlusion', rows: classify ? occlusionRows(m.md, r) : entityRows(m.md, r)},
      {method: 'alpha', rows: heatmaps(m.md, r.tokens || [])}]), layerMaps(r.tokens || [], r.layers || []));
    out.textContent = '';
    parts.forEach(function (p) { if (p) out.appendChild(p); });
    if ($('entity-why')) showEntity(0);
  }

  function request(m, text) {
    var md = m.md, options = {tokens: true, attention: $('want-attention').checked};
    if (md.task === 'classification') options.topK = (md.labels || []).length;
    if (!$('want-gates').disabled && $('want-gates').checked) options.gates = true;
    if (!$('want-layers').disabled && $('want-layers').checked) {
      options.layers = {attentionMaps: true, gates: hasOutput(md, /^layer_(gates|lambda)/), reduction: $('heads').value};
    }
    if (!$('want-check').disabled && $('want-check').checked) options.faithfulness = {topK: 3};
    if (!$('want-contributions').disabled && $('want-contributions').checked) options.contributions = true;
    if ($('want-occlusion').checked) options.occlusion = true;
    return {texts: [text], options: options};
  }

  // Each word of `answer` gets `subwords`: the vocabulary spellings of the sub-words `read` shows for it.
  function attachSubwords(answer, read) {
    (answer.results || []).forEach(function (r, i) {
      var words = r.tokens || [];
      ((read.results || [])[i] || {tokens: []}).tokens.forEach(function (s) {
        var w = words[s.word];
        if (s.word === undefined || s.word < 0 || !w) return;
        (w.subwords = w.subwords || []).push(s.normalized);
      });
    });
  }

  async function explain(event) {
    if (event) event.preventDefault();
    var m = selected(), text = $('text').value;
    if (!m || document.body.getAttribute('data-state') === 'busy') return;
    $('error').textContent = '';
    setState('busy');
    var verb = m.md.task === 'classification' ? ':classify' : ':tag', start = performance.now();
    try {
      var answer = await call(modelPath(m) + verb, request(m, text));
      if (m.md.tokenizer && m.md.tokenizer.level === 'subword') {
        // A sub-word model answers per word; the sub-words each word was read as come with a second,
        // cheap call (options.subwords) and show with the word's numbers on hover.
        var read = await call(modelPath(m) + verb, {texts: [text], options: {tokens: true, subwords: true}});
        attachSubwords(answer, read);
      }
      renderAnswer(m, text, answer, performance.now() - start);
      setState('answered');
    } catch (e) {
      $('answer').textContent = '';
      $('error').textContent = e.message;
      setState('error');
    }
  }

  // --- keyboard -------------------------------------------------------------------------------------
  // A roving tab stop: one item of the group is in the tab order; arrow keys (mirrored in right-to-left
  // rows), Home and End move it. cols > 0 makes a grid (Up and Down move by a row).
  function roving(group, items, cols) {
    if (!items.length) return;
    items[0].tabIndex = 0;
    group.addEventListener('keydown', function (e) {
      var i = items.indexOf(document.activeElement);
      if (i < 0) return;
      var rtl = getComputedStyle(group).direction === 'rtl', step = {ArrowRight: rtl ? -1 : 1,
        ArrowLeft: rtl ? 1 : -1, ArrowDown: cols || 0, ArrowUp: -(cols || 0), Home: -i, End: items.length - 1 - i}[e.key];
      if (!step) return;
      var j = Math.min(items.length - 1, Math.max(0, i + step));
      e.preventDefault();
      items[i].tabIndex = -1;
      items[j].tabIndex = 0;
      items[j].focus();
    });
  }

  function showInfo(e) {
    var t = e.target.closest ? e.target.closest('[data-info]') : null;
    if (t) $('status').textContent = t.getAttribute('data-info');
  }

  // A click (or Enter or Space) on an entity shows its occlusion row.
  function onEntity(e) {
    var m = e.target.closest ? e.target.closest('mark.ent') : null;
    if (!m || (e.type === 'keydown' && e.key !== 'Enter' && e.key !== ' ')) return;
    if (e.type === 'keydown') e.preventDefault();
    showEntity(m.getAttribute('data-entity'));
  }

  document.addEventListener('click', onEntity);
  document.addEventListener('keydown', onEntity);
  document.addEventListener('mouseover', showInfo);
  document.addEventListener('focusin', showInfo);
  $('ask').addEventListener('submit', explain);
  $('model').addEventListener('change', onModel);
  $('text').addEventListener('keydown', function (e) {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) explain(e);
  });
  function start() {
    $('error').textContent = '';
    loadModels().then(function () { setState('ready'); }, function (e) {
      $('error').textContent = 'could not list the models: ' + e.message;
      setState('error');
    });
  }
  $('key-form').addEventListener('submit', function (e) {
    e.preventDefault();
    try { sessionStorage.setItem('qvi-api-key', $('api-key').value.trim()); } catch (err) { /* private mode */ }
    $('api-key').value = '';
    $('key-row').hidden = true;
    setState('loading');
    start();
  });
  start();
})();
