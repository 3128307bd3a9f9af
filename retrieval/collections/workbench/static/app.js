// The workbench page: plain DOM, no framework, every state on the server (the database), so a
// reload shows what was decided. Relative URLs: the app may sit under any prefix.
'use strict';
const $ = (sel, root = document) => root.querySelector(sel);
const BOX = 380;  // px: a viewer's side (app.css .view)

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  node.append(...children);
  return node;
}

function say(text, error = false) {
  const status = $('#status');
  status.textContent = text;
  status.className = error ? 'error' : '';
}

// Every POST carries X-Workbench (the app refuses a POST without it: another site's form).
async function api(url, options = {}) {
  options.headers = Object.assign({'X-Workbench': '1'}, options.headers || {});
  const response = await fetch(url, options);
  const body = await response.json().catch(() => ({error: response.statusText}));
  if (!response.ok) {
    const message = body.error || (body.detail && JSON.stringify(body.detail)) || response.status;
    say(message, true);
    throw new Error(message);
  }
  return body;
}

const imageUrl = (path, size = 0) =>
  `image?path=${encodeURIComponent(path)}${size ? `&size=${size}` : ''}`;

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
    const img = el('img', {src: imageUrl(path), alt: path, draggable: 'false'});
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
      v.img.style.filter = `contrast(${common.contrast}%)${s.invert ? ' invert(1)' : ''}`;
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
      tool('invert', 'black on white / white on black', () => { v.state.invert = !v.state.invert; }),
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
                                                               el('div', {class: 'path'}, v.path)))));
}

// ------------------------------------------------------------------ rounds and decisions

let anchor = '';

async function nextRound() {
  const round = await api(`api/round${anchor ? `?path=${encodeURIComponent(anchor)}` : ''}`);
  $('#round-what').textContent = (anchor ? `Nearest of ${anchor} not yet decided with it` :
    'The closest pairs of the collection not yet decided') + `: ${round.pairs.length} ` +
    `(${round.decided} pairs decided so far)`;
  $('#round-collection').hidden = !anchor;
  const list = $('#pairs');
  list.replaceChildren(...round.pairs.map(pairCard));
  if (!round.pairs.length) say('No undecided candidate left in this list.');
}

function pairCard(pair) {
  const note = el('input', {class: 'note', placeholder: 'note (optional)'});
  const card = el('div', {class: 'pair', 'data-a': pair.a, 'data-b': pair.b},
    el('h3', {}, `rank ${pair.rank}, distance ${pair.distance.toFixed(3)}`));
  const outcome = el('span', {class: 'outcome'});
  const decide = async verdict => {
    const scholar = $('#scholar').value.trim();
    if (!scholar) { say('Give your name (Scholar, at the top) before deciding.', true); return; }
    const kept = await api('api/decisions', {method: 'POST',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({a: pair.a, b: pair.b, verdict, note: note.value, scholar,
                            distance: pair.distance, rank: pair.rank})});
    card.classList.add('decided');
    card.dataset.decision = kept.id;
    outcome.replaceChildren(`Decided: ${verdict} (kept, #${kept.id}) `,
      el('button', {class: 'undo', onclick: async () => {
        await api(`api/decisions/${kept.id}/undo`, {method: 'POST'});
        card.classList.remove('decided');
        delete card.dataset.decision;
        outcome.textContent = 'Undone.';
        say(`Decision #${kept.id} undone: the pair is back in the queue.`);
      }}, 'undo'));
    say(`Kept: ${pair.a} / ${pair.b}: ${verdict}.`);
  };
  card.append(viewer(pair.a, pair.b), el('div', {class: 'decide'},
    el('button', {class: 'same', onclick: () => decide('same')}, 'Same hand'),
    el('button', {class: 'different', onclick: () => decide('different')}, 'Different'),
    el('button', {class: 'unsure', onclick: () => decide('unsure')}, 'Unsure'),
    note, outcome));
  return card;
}

async function loadDecisions() {
  const {decisions} = await api('api/decisions');
  $('#decision-list tbody').replaceChildren(...decisions.map(d => el('tr',
    {'data-id': d.id, class: 'decision'},
    el('td', {}, `${d.a} / ${d.b}`), el('td', {class: 'verdict'}, d.verdict),
    el('td', {}, d.note), el('td', {}, d.scholar + (d.origin ? ` (${d.origin})` : '')),
    el('td', {}, d.rank ? `rank ${d.rank}, ${d.distance}` : ''), el('td', {}, d.decided_at),
    el('td', {}, el('button', {class: 'undo', onclick: async () => {
      await api(`api/decisions/${d.id}/undo`, {method: 'POST'});
      say(`Decision #${d.id} undone.`);
      loadDecisions();
    }}, 'undo')))));
}

async function importFile(file) {
  const result = await api(`api/import?name=${encodeURIComponent(file.name)}`,
                           {method: 'POST', body: file});
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
  loadDecisions();
}

// ------------------------------------------------------------------ collection, search, groups

let page = 1;

async function loadPage() {
  const filter = $('#filter').value;
  const items = await api(`api/items?page=${page}&per=48&q=${encodeURIComponent(filter)}`);
  const pages = Math.max(1, Math.ceil(items.total / items.per));
  $('#page-what').textContent = `page ${page} of ${pages} (${items.total} images)`;
  $('#thumbs').replaceChildren(...items.paths.map(path => {
    const figure = thumb(path, path, () => searchPath(path));
    figure.append(el('button', {class: 'joins-for', onclick: () => {
      anchor = path; show('joins'); nextRound(); }}, 'joins for this'));
    return figure;
  }));
}

function showResults(query, matches) {
  $('#results').replaceChildren(...matches.map(m =>
    thumb(m.path, `${m.rank}. ${m.distance.toFixed(3)} ${m.path}`, () => searchPath(m.path))));
  say(`${matches.length} nearest of ${query}.`);
}

async function searchPath(path) {
  show('search');
  $('#search-path').value = path;
  const found = await api(`api/search?path=${encodeURIComponent(path)}`);
  $('#query').replaceChildren(thumb(path, `query: ${path}`));
  showResults(path, found.matches);
}

async function searchUpload(file) {
  say(`Embedding ${file.name} with the index's checkpoint…`);
  const found = await api(`api/search/upload?name=${encodeURIComponent(file.name)}`,
                          {method: 'POST', body: file});
  $('#query').replaceChildren(el('figure', {}, el('img', {src: URL.createObjectURL(file)}),
                                 el('figcaption', {}, `query: ${file.name} (yours)`)));
  showResults(file.name, found.matches);
}

async function loadGroups() {
  const {groups} = await api('api/groups');
  $('#group-list').replaceChildren(...(groups.length ? groups.map((g, k) =>
    el('div', {class: 'group'}, el('h3', {}, `Group ${k + 1}: ${g.length} fragments`),
       el('div', {class: 'grid'}, ...g.map(p => thumb(p, p, () => searchPath(p)))))) :
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
  $('#round-collection').addEventListener('click', () => { anchor = ''; nextRound(); });
  $('#prev-page').addEventListener('click', () => { page = Math.max(1, page - 1); loadPage(); });
  $('#next-page').addEventListener('click', () => { page += 1; loadPage(); });
  $('#filter').addEventListener('change', () => { page = 1; loadPage(); });
  $('#search-go').addEventListener('click', () => searchPath($('#search-path').value.trim()));
  $('#upload').addEventListener('change', e => e.target.files[0] && searchUpload(e.target.files[0]));
  $('#import-file').addEventListener('change',
                                     e => e.target.files[0] && importFile(e.target.files[0]));
  const info = await api('api/info');
  $('#info').textContent = `${info.images} images of ${info.root}; checkpoint step ` +
    `${info.step} (${info.checkpoint}); ${info.decisions} pairs decided; decisions in ${info.db}.`;
  show('joins');
  await nextRound();
  document.body.dataset.ready = '1';  // for the tests: the first round is drawn
});
