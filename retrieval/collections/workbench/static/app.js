// The workbench page: plain DOM, no framework, every state on the server (the database), so a
// reload shows what was decided. Relative URLs: the app may sit under any prefix.
'use strict';
const $ = (sel, root = document) => root.querySelector(sel);
const BOX = 380;  // px: a viewer's side (app.css .view)

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith('on')) {
      node.addEventListener(k.slice(2), e => {
        const done = v(e);
        done?.catch?.(() => {});  // a refusal was said where it happened (api's `where`)
      });
    }
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  node.append(...children);
  return node;
}

// A message where the scholar is looking: `where` (the card or hit acted on), else the
// status line (kept in view at the top of the window).
function say(text, error = false, where = null) {
  const status = where || $('#status');
  status.textContent = text;
  status.classList.toggle('error', error);
}

// Every POST carries X-Workbench (the app refuses a POST without it: another site's form).
async function api(url, options = {}, where = null) {
  options.headers = Object.assign({'X-Workbench': '1'}, options.headers || {});
  let response;
  try {
    response = await fetch(url, options);
  } catch (e) {
    say(`The workbench did not answer (${e.message}): is launch.serve still running?`, true, where);
    throw e;
  }
  // An answer cut off (the server stopped mid-way) is no answer, even after a 200.
  const body = await response.json().catch(() => null);
  if (!response.ok || body === null) {
    const message = body?.error || (body === null && response.ok ?
      'The workbench\'s answer was cut off: reload the page to see what was kept' :
      `${response.status} ${response.statusText}`);
    say(message, true, where);
    throw new Error(message);
  }
  return body;
}

// What a scholar reads for a path: its shelfmark when the collection gives one.
let shelfmarks = {};
let shownIndex;  // the reloaded_at whose shelfmarks are loaded
const label = path => shelfmarks[path] || path;

// Where a pair stands, in words: its rank in its list, and the share of the list above it.
function place(pair) {
  if (pair.of == null) return pair.scholar ? `unsure (${pair.scholar})` : 'unsure';
  const share = 100 * pair.rank / pair.of;
  const top = share < 10 ? share.toPrecision(1) : Math.round(share);
  return (anchor ? `nearest ${pair.rank} of ${pair.of.toLocaleString('en')}` :
          `closest pair ${pair.rank} of ${pair.of.toLocaleString('en')}`) + ` (top ${top}%)`;
}

async function refreshInfo() {
  const info = await api('api/info');
  const c = info.counts;
  $('#counts').textContent = `${info.decisions} pairs decided: ${c.same} same hand, ` +
    `${c.different} different, ${c.unsure} unsure` +
    (info.dissent ? `; ${info.dissent} with dissent` : '');
  $('#unsure-queue').textContent = `Unsure pairs (${c.unsure})`;
  $('#info').textContent = `${info.images} images of ${info.collection || info.root}; ` +
    `checkpoint step ${info.step} (${info.checkpoint}); decisions in ${info.db}.` +
    (info.reloaded_at ? ` Index rebuilt and reloaded at ${info.reloaded_at}.` : '');
  if (info.reloaded_at !== shownIndex) {  // at the start, and when the index was rebuilt
    shownIndex = info.reloaded_at;
    shelfmarks = info.identified ? await api('api/shelfmarks') : {};
  }
  return info;
}

const imageUrl = (path, size = 0, cutout = false) =>
  `image?path=${encodeURIComponent(path)}${size ? `&size=${size}` : ''}` +
  (cutout ? '&cutout=1' : '');

function thumb(path, caption, onclick) {
  return el('figure', {class: 'thumb', 'data-path': path},
            el('img', {src: imageUrl(path, 150), alt: path, title: path, loading: 'lazy',
                       onclick}),
            el('figcaption', {}, caption));
}

// ------------------------------------------------------------------ tabs

function show(tab) {
  for (const section of document.querySelectorAll('body > section')) {
    section.hidden = section.id !== tab;
  }
  for (const button of document.querySelectorAll('nav button')) {
    button.classList.toggle('on', button.dataset.tab === tab);
  }
  ({joins: () => {}, collection: loadPage, search: () => {}, groups: loadGroups,
    decisions: loadDecisions})[tab]();
}

// ------------------------------------------------------------------ the viewer

// One pair at one common scale: both images are drawn at the same pixels per image pixel,
// so sizes compare; zoom keeps it common, the rest is per image.
function viewer(pathA, pathB) {
  const views = [pathA, pathB].map(path => {
    const img = el('img', {src: imageUrl(path), alt: label(path), draggable: 'false'});
    const state = {x: 0, y: 0, rotate: 0, mirror: false, invert: false};
    const view = el('div', {class: 'view'}, img);
    return {path, img, view, state};
  });
  const common = {zoom: 1, contrast: 100, scale: 1};
  const draw = () => {
    for (const v of views) {
      const s = v.state;
      v.img.style.width = `${v.img.naturalWidth * common.scale * common.zoom}px`;
      v.img.style.transform = `translate(-50%, -50%) translate(${s.x}px, ${s.y}px) ` +
        `rotate(${s.rotate}deg) scaleX(${s.mirror ? -1 : 1})`;
      // Greyscale before inverting: parchment turns dark grey, not navy.
      v.img.style.filter = `contrast(${common.contrast}%)` +
        (s.invert ? ' grayscale(1) invert(1)' : '');
    }
  };
  const loaded = Promise.all(views.map(v => v.img.decode().catch(() => {})));
  loaded.then(() => {
    const largest = Math.max(...views.map(v => Math.max(v.img.naturalWidth,
                                                        v.img.naturalHeight)), 1);
    common.scale = Math.min(1, (BOX - 8) / largest);
    draw();
  });
  for (const v of views) {
    const tool = (label, title, fn) => el('button', {title, onclick: () => { fn(); draw(); }},
                                           label);
    v.view.prepend(el('div', {class: 'tools'},
      tool('invert', 'greyscale, inverted: white ink on black', () => {
        v.state.invert = !v.state.invert; }),
      tool('mirror', 'mirror left-right', () => { v.state.mirror = !v.state.mirror; }),
      tool('rotate', 'rotate 90°', () => { v.state.rotate = (v.state.rotate + 90) % 360; }),
      tool('reset', 'back to the start', () => {
        Object.assign(v.state, {x: 0, y: 0, rotate: 0, mirror: false, invert: false}); })));
    // Pan: drag the image.
    v.view.addEventListener('pointerdown', down => {
      if (down.target.tagName === 'BUTTON') return;
      const start = {x: down.clientX - v.state.x, y: down.clientY - v.state.y};
      const move = e => { v.state.x = e.clientX - start.x; v.state.y = e.clientY - start.y; draw(); };
      const up = () => { removeEventListener('pointermove', move); removeEventListener('pointerup', up); };
      addEventListener('pointermove', move);
      addEventListener('pointerup', up);
    });
    // Zoom: the wheel, both images alike.
    v.view.addEventListener('wheel', e => {
      e.preventDefault();
      common.zoom = Math.min(16, Math.max(0.25, common.zoom * (e.deltaY < 0 ? 1.25 : 0.8)));
      draw();
    });
  }
  const zoom = f => () => { common.zoom = Math.min(16, Math.max(0.25, common.zoom * f)); draw(); };
  const controls = el('div', {class: 'bar'},
    el('button', {class: 'zoom-in', onclick: zoom(1.25)}, 'zoom +'),
    el('button', {class: 'zoom-out', onclick: zoom(0.8)}, 'zoom −'),
    el('label', {}, 'contrast ', el('input', {type: 'range', min: 50, max: 300, value: 100,
      class: 'contrast', oninput: e => { common.contrast = e.target.value; draw(); }})),
    el('span', {class: 'scale'}));
  loaded.then(() => {
    $('.scale', controls).textContent = `both at ${Math.round(common.scale * 100)}% of their pixels`;
  });
  return el('div', {}, controls,
            el('div', {class: 'views'}, ...views.map(v => el('div', {}, v.view,
                                                               el('div', {class: 'path'}, label(v.path))))));
}

// ------------------------------------------------------------------ rounds and decisions

let anchor = '';  // one image's round: its path
let unsureQueue = false;
let current = -1;  // the card the keys act on
const madeHere = [];  // [card] in the order decided on this page, for undo (Z)

async function nextRound() {
  const query = unsureQueue ? '?unsure=1' : anchor ? `?path=${encodeURIComponent(anchor)}` : '';
  const round = await api(`api/round${query}`);
  $('#round-what').textContent = unsureQueue ? 'Pairs decided "unsure", to look at again' :
    anchor ? `The nearest of ${label(anchor)} not yet decided with it` :
    'The closest pairs of the collection not yet decided';
  $('#round-collection').hidden = !anchor && !unsureQueue;
  $('#anchor').replaceChildren(...(anchor ? [thumb(anchor, `anchor: ${label(anchor)}`)] : []));
  const cards = round.pairs.map(pairCard);
  $('#pairs').replaceChildren(...cards);
  madeHere.length = 0;
  current = -1;
  progress();
  if (cards.length) focusCard(0);
  else say(unsureQueue ? 'No pair is left decided "unsure".' :
           'No undecided candidate left in this list.');
}

const cardsShown = () => [...document.querySelectorAll('#pairs .pair')];

function progress() {
  const cards = cardsShown();
  const decided = cards.filter(c => c.dataset.decision).length;
  $('#progress').textContent = cards.length ?
    `${current + 1} of ${cards.length} (${decided} decided)` : '';
}

// The current card shows its pair in the viewer; the others are one line each.
function focusCard(k) {
  const cards = cardsShown();
  if (!cards.length) return;
  k = Math.max(0, Math.min(k, cards.length - 1));
  if (cards[current] && current !== k) {
    cards[current].classList.remove('current');
    cards[current].querySelector('.viewer')?.remove();
  }
  current = k;
  const card = cards[k];
  if (!card.classList.contains('current')) {
    card.classList.add('current');
    card.append(el('div', {class: 'viewer'}, viewer(card.dataset.a, card.dataset.b)));
  }
  card.scrollIntoView({block: 'nearest'});
  progress();
}

function nextUndecided() {
  const cards = cardsShown();
  for (let k = current + 1; k < cards.length; k++) {
    if (!cards[k].dataset.decision) return focusCard(k);
  }
  progress();
  say(`All ${cards.length} pairs of this round decided: "Next round" for more.`);
}

function pairCard(pair, k) {
  const note = el('input', {class: 'note', placeholder: 'note (optional)'});
  const outcome = el('span', {class: 'outcome', role: 'status'});
  const card = el('div', {class: 'pair', 'data-a': pair.a, 'data-b': pair.b});
  // where: the element for an error (the card's, or the joining table's).
  card.decide = async (verdict, where = outcome) => {
    const scholar = $('#scholar').value.trim();
    if (!scholar) {
      say('Give your name (Scholar, at the top) before deciding.', true, where);
      if (where === outcome) $('#scholar').focus();
      return;
    }
    const kept = await api('api/decisions', {method: 'POST',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({a: pair.a, b: pair.b, verdict, note: note.value, scholar,
                            distance: pair.distance, rank: pair.rank})}, where);
    card.classList.add('decided');
    card.dataset.decision = kept.id;
    card.dataset.verdict = verdict;
    madeHere.push(card);
    outcome.classList.remove('error');
    outcome.replaceChildren(`${verdict} (kept, #${kept.id}) `,
      el('button', {class: 'undo', onclick: () => card.undo()}, 'undo'));
    refreshInfo();
    if (cardsShown()[current] === card) nextUndecided();
    else progress();
  };
  card.undo = async () => {
    const id = card.dataset.decision;
    await api(`api/decisions/${id}/undo`, {method: 'POST',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({scholar: $('#scholar').value.trim()})}, outcome);
    card.classList.remove('decided');
    delete card.dataset.decision;
    delete card.dataset.verdict;
    madeHere.splice(madeHere.indexOf(card), 1);
    outcome.textContent = 'Undone.';
    say(`Decision #${id} undone: the pair is back in the queue.`);
    refreshInfo();
    progress();
  };
  const shown = anchor ? [pair.b] : [pair.a, pair.b];  // the anchor is shown once, above
  card.append(el('div', {class: 'line', onclick: e => {
      if (!['BUTTON', 'INPUT'].includes(e.target.tagName)) focusCard(cardsShown().indexOf(card));
    }},
    el('span', {class: 'nth'}, `${k + 1}`),
    ...shown.map(p => el('img', {class: 'mini', src: imageUrl(p, 64), alt: label(p),
                                 title: label(p)})),
    el('span', {class: 'names'}, shown.map(label).join(' / ')),
    el('span', {class: 'place'}, place(pair)),
    el('button', {class: 'same', title: 'S', onclick: () => card.decide('same')}, 'Same hand'),
    el('button', {class: 'different', title: 'D', onclick: () => card.decide('different')},
       'Different'),
    el('button', {class: 'unsure', title: 'U', onclick: () => card.decide('unsure')}, 'Unsure'),
    el('button', {class: 'to-table', title: 'T', onclick: () => openTable(pair, card)},
       'Joining table'),
    note, outcome));
  return card;
}

// The keys of a round, as the page lists them (#keys); not while typing in a field.
const KEYS = {s: 'same', d: 'different', u: 'unsure'};
function onKey(e) {
  const typing = ['INPUT', 'TEXTAREA'].includes(e.target.tagName);
  if (e.ctrlKey || e.metaKey || e.altKey || typing) return;
  if (!$('#table').hidden) return tableKey(e);
  if ($('#joins').hidden) return;
  const card = cardsShown()[current];
  const key = e.key.toLowerCase();
  if (card && KEYS[key]) card.decide(KEYS[key]).catch(() => {});
  else if (key === 'n' || e.key === 'ArrowRight' || e.key === 'ArrowDown') focusCard(current + 1);
  else if (key === 'p' || e.key === 'ArrowLeft' || e.key === 'ArrowUp') focusCard(current - 1);
  else if (key === 'z' && madeHere.length) {
    const last = madeHere[madeHere.length - 1];
    focusCard(cardsShown().indexOf(last));
    last.undo().catch(() => {});
  } else if (key === 't' && card) card.querySelector('.to-table').click();
  else return;
  e.preventDefault();
}

async function loadDecisions() {
  const {decisions} = await api('api/decisions');
  $('#decision-list tbody').replaceChildren(...decisions.map(d => {
    const where = el('span', {class: 'outcome'});
    return el('tr', {'data-id': d.id, class: 'decision'},
      el('td', {}, `${label(d.a)} / ${label(d.b)}`), el('td', {class: 'verdict'}, d.verdict),
      el('td', {class: 'dissent'}, d.dissent.map(x => `${x.verdict} (${x.scholar})`).join(', ')),
      el('td', {}, d.note), el('td', {}, d.scholar + (d.origin ? ` (${d.origin})` : '')),
      el('td', {}, d.rank ? `rank ${d.rank}` : ''), el('td', {}, d.decided_at),
      el('td', {class: 'history', title: d.history.map(h =>
        `${h.decided_at}: ${h.verdict} (${h.scholar}), ${h.status}`).join('\n')},
        d.history.length ? `${d.history.length} earlier` : ''),
      el('td', {}, el('button', {class: 'undo', onclick: async () => {
        await api(`api/decisions/${d.id}/undo`, {method: 'POST',
          headers: {'Content-Type': 'application/json'},
          body: JSON.stringify({scholar: $('#scholar').value.trim()})}, where);
        say(`Decision #${d.id} undone.`);
        refreshInfo();
        loadDecisions();
      }}, 'undo'), where));
  }));
}

async function importFile(file) {
  const result = await api(`api/import?name=${encodeURIComponent(file.name)}`,
                           {method: 'POST', body: file}, $('#import-result'));
  const lines = [el('p', {}, `${file.name}: ${result.added} added, ${result.already} already ` +
                              `here, ${result.undone} undone as there; ${result.changed.length} ` +
                              `verdicts changed, ${result.dissent.length} pairs with dissent.`)];
  if (result.changed.length) {
    lines.push(el('ul', {class: 'changed'}, ...result.changed.map(c => el('li', {},
      `${c.a} / ${c.b}: ${c.was || 'undecided'} → ${c.now || 'undecided'}` +
      (c.by ? ` (${c.by})` : '')))));
  }
  if (result.dissent.length) {
    lines.push(el('ul', {class: 'dissent'}, ...result.dissent.map(c => el('li', {},
      `${c.a} / ${c.b}: ${c.standing} (${c.by}); dissent: ` +
      c.dissent.map(d => `${d.verdict} (${d.scholar})`).join(', ')))));
  }
  $('#import-result').replaceChildren(...lines);
  say(`Imported ${file.name}.`);
  refreshInfo();
  loadDecisions();
}

// ------------------------------------------------------------------ the joining table

// Two fragments on one OpenSeadragon canvas: each dragged (press on it) and rotated against
// the other; the canvas pans and zooms as any viewer. Both are placed at one physical scale
// (viewport units of centimetres) when the collection knows each image's resolution, else
// at one pixel scale. The viewer is kept on #table (.osd) for the tests.
const table = {pair: null, card: null, items: [], selected: 0};

function setupTable() {
  const box = $('#table');
  box.osd = OpenSeadragon({element: $('#table-canvas'), drawer: 'canvas',
    showNavigationControl: false, gestureSettingsMouse: {clickToZoom: false},
    visibilityRatio: 0, minZoomImageRatio: 0.05, maxZoomPixelRatio: 8, animationTime: 0.3,
    keyboardNavEnabled: false});
  const osd = box.osd;
  let dragging = null;
  osd.addHandler('canvas-press', e => {
    const at = osd.viewport.pointFromPixel(e.position);
    dragging = null;
    // The topmost fragment under the pointer (the later item is drawn above).
    for (let k = table.items.length - 1; k >= 0; k--) {
      const bounds = table.items[k].getBoundsNoRotate();
      const centre = bounds.getCenter();
      const local = at.rotate(-table.items[k].getRotation(), centre);  // into its frame
      if (local.x >= bounds.x && local.x <= bounds.x + bounds.width &&
          local.y >= bounds.y && local.y <= bounds.y + bounds.height) {
        dragging = table.items[k];
        selectFragment(k);
        break;
      }
    }
  });
  osd.addHandler('canvas-drag', e => {
    if (!dragging) return;  // on the cloth: the canvas pans
    e.preventDefaultAction = true;
    const delta = osd.viewport.deltaPointsFromPixels(e.delta);
    dragging.setPosition(dragging.getBoundsNoRotate().getTopLeft().plus(delta), true);
    tableState();
  });
  osd.addHandler('canvas-release', () => { dragging = null; });
  const tools = $('#table-tools');
  const button = (cls, text, title, fn) => el('button', {class: cls, title, onclick: fn}, text);
  tools.append(
    button('rotate-left', '↺ 5°', 'Q (shift: 1°)', () => rotateSelected(-5)),
    button('rotate-right', '↻ 5°', 'E (shift: 1°)', () => rotateSelected(5)),
    button('rotate-90', '↻ 90°', 'R', () => rotateSelected(90)),
    button('swap', 'other fragment', 'Tab', () => selectFragment(1 - table.selected)),
    button('invert', 'invert', 'I: greyscale, inverted', () => {
      $('#table-canvas').classList.toggle('inverted'); tableState(); }),
    button('full', 'full screen', 'F', fullScreen),
    button('reset', 'reset', 'side by side again', placeFragments),
    button('same', 'Same hand', 'S', () => decideFromTable('same')),
    button('different', 'Different', 'D', () => decideFromTable('different')),
    button('unsure', 'Unsure', 'U', () => decideFromTable('unsure')),
    button('close', 'close', 'Esc', closeTable));
}

function fullScreen() {
  const box = $('#table');
  if (document.fullscreenElement) document.exitFullscreen();
  else box.requestFullscreen().catch(e => say(`Full screen refused by the browser (${e.message})`,
                                              true, $('#table-status')));
}

async function openTable(pair, card) {
  Object.assign(table, {pair, card, items: [], selected: 0});
  const box = $('#table');
  box.hidden = false;
  $('#table-canvas').classList.remove('inverted');
  $('#table-what').textContent = `${label(pair.a)} / ${label(pair.b)}`;
  say('Drag a fragment to move it, the cloth to pan, the wheel to zoom; Q/E rotate the ' +
      'chosen one.', false, $('#table-status'));
  const infos = await Promise.all([pair.a, pair.b].map(p =>
    api(`api/image-info?path=${encodeURIComponent(p)}`, {}, $('#table-status'))));
  const osd = box.osd;
  osd.world.removeAll();
  await Promise.all(infos.map(info => new Promise((resolve, reject) => osd.addTiledImage({
    tileSource: {type: 'image', url: imageUrl(info.path, 0, true), buildPyramid: false},
    success: e => { e.item.info = info; resolve(); }, error: e => reject(new Error(e.message)),
  }))));
  table.items = [0, 1].map(k => osd.world.getItemAt(k));
  placeFragments();
}

// Side by side, at one physical scale (cm) when both resolutions are known.
function placeFragments() {
  const physical = table.items.every(item => item.info.ppcm);
  let x = 0;
  for (const item of table.items) {
    const {width, ppcm} = item.info;
    item.setWidth(physical ? width / ppcm : width / 100, true);
    item.setRotation(0, true);
    item.setPosition(new OpenSeadragon.Point(x, 0), true);
    x += item.getBoundsNoRotate().width * 1.05;
  }
  $('#table-scale').textContent = physical ?
    'one physical scale: each at its own resolution (' +
    table.items.map(i => `${Math.round(i.info.ppcm * 2.54)} ppi`).join(', ') + ')' :
    'one pixel scale: the resolution of ' +
    table.items.filter(i => !i.info.ppcm).map(i => label(i.info.path)).join(' and ') +
    ' is not known';
  selectFragment(0);
  // Both in view (the world's home is not yet told of the new places).
  const bounds = table.items.map(i => i.getBounds());
  const left = Math.min(...bounds.map(b => b.x)), top = Math.min(...bounds.map(b => b.y));
  const right = Math.max(...bounds.map(b => b.x + b.width));
  const bottom = Math.max(...bounds.map(b => b.y + b.height));
  const pad = 0.05 * Math.max(right - left, bottom - top);
  $('#table').osd.viewport.fitBounds(new OpenSeadragon.Rect(left - pad, top - pad,
    right - left + 2 * pad, bottom - top + 2 * pad), true);
  tableState();
}

function selectFragment(k) {
  table.selected = k;
  $('#table-selected').textContent = `chosen: ${label(table.items[k]?.info.path || '')}`;
  tableState();
}

function rotateSelected(degrees) {
  const item = table.items[table.selected];
  if (!item) return;
  item.setRotation((item.getRotation() + degrees + 360) % 360, true);
  tableState();
}

// The table's state on the page, as the scholar (and the tests) read it.
function tableState() {
  $('#table').dataset.state = JSON.stringify({
    selected: table.selected, inverted: $('#table-canvas').classList.contains('inverted'),
    items: table.items.map(i => { const b = i.getBoundsNoRotate();
      return {x: b.x, y: b.y, width: b.width, rotation: i.getRotation()}; })});
}

async function decideFromTable(verdict) {
  if (table.card) {
    await table.card.decide(verdict, $('#table-status'));
    if (table.card.dataset.decision) {
      say(`${verdict} (kept, #${table.card.dataset.decision})`, false, $('#table-status'));
    }
  }
}

function closeTable() {
  if (document.fullscreenElement) document.exitFullscreen();
  $('#table').hidden = true;
}

function tableKey(e) {
  const key = e.key.toLowerCase();
  const step = e.shiftKey ? 1 : 5;
  if (KEYS[key]) decideFromTable(KEYS[key]).catch(() => {});
  else if (key === 'q') rotateSelected(-step);
  else if (key === 'e') rotateSelected(step);
  else if (key === 'r') rotateSelected(90);
  else if (key === 'i') $('#table-tools .invert').click();
  else if (key === 'f') fullScreen();
  else if (e.key === 'Tab') selectFragment(1 - table.selected);
  else if (e.key === 'Escape') closeTable();
  else return;
  e.preventDefault();
}

// ------------------------------------------------------------------ collection, search, groups

let page = 1;

async function loadPage() {
  const filter = $('#filter').value;
  const items = await api(`api/items?page=${page}&per=48&q=${encodeURIComponent(filter)}`);
  page = items.page;  // the app stops paging at either end
  $('#page-what').textContent = `page ${items.page} of ${items.pages} (${items.total} images)`;
  $('#prev-page').disabled = items.page <= 1;
  $('#next-page').disabled = items.page >= items.pages;
  $('#thumbs').replaceChildren(...items.paths.map(path => {
    const figure = thumb(path, label(path), () => searchPath(path));
    figure.append(el('button', {class: 'joins-for', onclick: () => {
      anchor = path; unsureQueue = false; show('joins'); nextRound(); }}, 'joins for this'));
    return figure;
  }));
}

// A hit of a search by an indexed image can be decided as a pair with the query, there.
function showResults(query, matches, indexed) {
  $('#results').replaceChildren(...matches.map(m => {
    const figure = thumb(m.path, `${m.rank} of ${m.of}: ${label(m.path)}`,
                         () => searchPath(m.path));
    if (indexed) {
      const outcome = el('span', {class: 'outcome'});
      const decide = verdict => async () => {
        const scholar = $('#scholar').value.trim();
        if (!scholar) return say('Give your name (Scholar, at the top) before deciding.', true,
                                 outcome);
        const kept = await api('api/decisions', {method: 'POST',
          headers: {'Content-Type': 'application/json'},
          body: JSON.stringify({a: query, b: m.path, verdict, scholar, distance: m.distance,
                                rank: m.rank})}, outcome);
        figure.dataset.decision = kept.id;
        say(`${verdict} (kept, #${kept.id})`, false, outcome);
        refreshInfo();
      };
      figure.append(el('div', {class: 'decide'},
        el('button', {class: 'same', onclick: decide('same')}, 'Same'),
        el('button', {class: 'different', onclick: decide('different')}, 'Diff.'),
        el('button', {class: 'unsure', onclick: decide('unsure')}, '?')), outcome);
    }
    return figure;
  }));
  say(`${matches.length} nearest of ${label(query)}.`);
}

async function searchPath(path) {
  show('search');
  $('#search-path').value = path;
  const found = await api(`api/search?path=${encodeURIComponent(path)}`, {}, $('#results'));
  $('#query').replaceChildren(thumb(path, `query: ${label(path)}`));
  showResults(path, found.matches, true);
}

async function searchUpload(file) {
  say(`Embedding ${file.name} with the index's checkpoint…`);
  const found = await api(`api/search/upload?name=${encodeURIComponent(file.name)}`,
                          {method: 'POST', body: file}, $('#results'));
  $('#query').replaceChildren(el('figure', {}, el('img', {src: URL.createObjectURL(file)}),
                                 el('figcaption', {}, `query: ${file.name} (yours)`)));
  showResults(file.name, found.matches, false);
}

async function loadGroups() {
  const {groups} = await api('api/groups');
  $('#group-list').replaceChildren(...(groups.length ? groups.map((g, k) =>
    el('div', {class: 'group'}, el('h3', {}, `Group ${k + 1}: ${g.length} fragments`),
       el('div', {class: 'grid'}, ...g.map(p => thumb(p, label(p), () => searchPath(p)))))) :
    [el('p', {}, 'No pair decided "same hand" yet.')]));
}

// ------------------------------------------------------------------ start

addEventListener('DOMContentLoaded', async () => {
  const scholar = $('#scholar');
  scholar.value = localStorage.getItem('scholar') || '';
  scholar.addEventListener('change', () => localStorage.setItem('scholar', scholar.value.trim()));
  for (const button of document.querySelectorAll('nav button')) {
    button.addEventListener('click', () => show(button.dataset.tab));
  }
  $('#next-round').addEventListener('click', nextRound);
  $('#unsure-queue').addEventListener('click', () => {
    unsureQueue = true; anchor = ''; nextRound(); });
  $('#round-collection').addEventListener('click', () => {
    anchor = ''; unsureQueue = false; nextRound(); });
  $('#prev-page').addEventListener('click', () => { page -= 1; loadPage(); });
  $('#next-page').addEventListener('click', () => { page += 1; loadPage(); });
  $('#filter').addEventListener('change', () => { page = 1; loadPage(); });
  $('#search-go').addEventListener('click', () => searchPath($('#search-path').value.trim()));
  $('#upload').addEventListener('change', e => e.target.files[0] && searchUpload(e.target.files[0]));
  $('#import-file').addEventListener('change',
                                     e => e.target.files[0] && importFile(e.target.files[0]));
  addEventListener('keydown', onKey);
  setupTable();
  await refreshInfo();
  show('joins');
  await nextRound();
  document.body.dataset.ready = '1';  // for the tests: the first round is drawn
});
