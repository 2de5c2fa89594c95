"""The dashboard in a real browser: headless Chromium (Debian's) driven by Selenium.

Usage: dashboard.py OPEN_URL JWT_URL TOKEN EXPECT_JSON SHOTS_DIR FULL_URL

OPEN_URL is a follower of a three-node cluster without JWT that tests/blackbox/dashboard.rs filled
(queues orders and jobs, the consumer group billing, a dead letter, a KV key, a timer, an ephemeral
queue; the S3 sink on every node); EXPECT_JSON holds the figures the API gave it.
JWT_URL is a node with broker JWT on and TOKEN a valid token for it; FULL_URL a node whose disk
gate is closed (a threshold below what its disk holds). Checks every view against the API's
figures (overview, queues, a queue, consumer groups, messages, a message, dead letters, KV, timers,
ephemeral queues, the sink with each queue's figures from the node that writes it, the replicated
log with every node's own figures), the retry and delete buttons, the token prompt and the disk
gate's banner, and saves a screenshot of each view in SHOTS_DIR.
Every wait is bounded; prints "dashboard browser ok" at the end.
"""

import json
import os
import signal
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 15


def bail(*_):
    print("the browser test overran its 100 s bound", flush=True)
    os._exit(3)


signal.signal(signal.SIGALRM, bail)
signal.alarm(100)

# `dashboard.py banner URL TEXT SHOTS_DIR NAME`: only checks that the page of URL shows TEXT in
# its banner, and saves the screenshot NAME.png.
MODE = "banner" if sys.argv[1] == "banner" else "all"
if MODE == "banner":
    open_url, banner_text, shots, banner_shot = sys.argv[2:6]
else:
    open_url, jwt_url, token, expect_file, shots, full_url = sys.argv[1:7]
    expect = json.load(open(expect_file))
os.makedirs(shots, exist_ok=True)
started = time.monotonic()


def api(path, body=None):
    req = urllib.request.Request(open_url + path, method="POST" if body is not None else "GET")
    data = None
    if body is not None:
        req.add_header("content-type", "application/json")
        data = json.dumps(body).encode()
    with urllib.request.urlopen(req, data=data, timeout=10) as r:
        return json.loads(r.read() or b"null")


opts = Options()
for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
          "--window-size=1280,900", "--hide-scrollbars", "--force-device-scale-factor=1"]:
    opts.add_argument(a)
opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=opts)
driver.set_page_load_timeout(WAIT)
driver.set_script_timeout(WAIT)


def wait(what, cond, limit=WAIT):
    """Until cond() is true; an element replaced while it was read (a view re-rendered) is
    read again at the next poll."""
    since = time.monotonic()
    try:
        got = WebDriverWait(driver, limit, poll_frequency=0.2, ignored_exceptions=[StaleElementReferenceException]).until(lambda d: cond())
        if time.monotonic() - since > 3:
            print(f"slow wait: {time.monotonic() - since:.1f} s for {what}", flush=True)
        return got
    except Exception as e:
        shot("failed")
        raise AssertionError(f"waited {time.monotonic() - since:.1f} s for {what} ({type(e).__name__}); the page says:\n{driver.find_element(By.TAG_NAME, 'body').text}")


def text_of(css):
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return els[0].text if els else None


def figure(key):
    return text_of(f"#view [data-figure='{key}']")


def shot(name):
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(700, min(height + 20, 2400)))
    driver.save_screenshot(os.path.join(shots, f"{name}.png"))
    print(f"shot {name} at {time.monotonic() - started:.1f} s", flush=True)
    driver.set_window_size(1280, 900)


def go(fragment, view):
    driver.get(f"{open_url}/#{fragment}")
    wait(f"the {view} view", lambda: driver.find_elements(By.CSS_SELECTOR, f"#view [data-view='{view}']"))


def reload(view):
    """Load the page again on the fragment it shows: going to the fragment it is already on is
    no navigation (no hashchange), so the view would keep the figures it rendered first."""
    driver.refresh()
    wait(f"the {view} view, reloaded", lambda: driver.find_elements(By.CSS_SELECTOR, f"#view [data-view='{view}']"))


def rows(css="#view table tbody tr"):
    return [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in driver.find_elements(By.CSS_SELECTOR, css)]


def num(v):
    return f"{v:,}" if isinstance(v, int) else str(v)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def banner_only():
    driver.get(f"{open_url}/#overview")
    wait(f"the banner {banner_text!r}", lambda: banner_text in driver.find_element(By.ID, "banner").text)
    check(driver.find_element(By.ID, "banner").is_displayed(), "the banner is hidden")
    shot(banner_shot)
    print(f"dashboard banner ok: {driver.find_element(By.ID, 'banner').text}", flush=True)


# The replicated log's view: the members as the leader sees them, and each node's own figures.
MEMBERS = "#view section > table tbody tr"
NODES = "[data-nodes] tbody tr"


def log_view(member_count):
    go("log", "log")
    wait(f"{member_count} members", lambda: len(rows(MEMBERS)) == member_count)
    members = rows(MEMBERS)
    roles = sorted(r[1] for r in members)
    check(roles == ["follower"] * (member_count - 1) + ["leader"], f"roles: {members}")
    check(all(r[2] == "yes" for r in members), f"a voter that is not live: {members}")
    # Each node's own figures, gathered by this node over the raft port: all reachable, one
    # leader, every node's applied index shown.
    wait(f"{member_count} nodes' figures", lambda: len(rows(NODES)) == member_count)
    nodes = rows(NODES)
    check(all(r[1] == "yes" for r in nodes), f"a node did not answer: {nodes}")
    check(sorted(r[3] for r in nodes) == ["follower"] * (member_count - 1) + ["leader"], f"nodes: {nodes}")
    check(all(r[6].replace(",", "").isdigit() and int(r[6].replace(",", "")) > 0 for r in nodes), f"applied: {nodes}")
    shot("cluster")
    print(f"dashboard cluster ok: {members} {nodes}", flush=True)


try:
    if MODE == "banner":
        banner_only()
        sys.exit(0)
    # Overview: the counts of /api/v1/resources/overview and this node's raft figures.
    ov = expect["overview"]
    go("overview", "overview")
    wait("the overview's figures", lambda: figure("queues") == num(ov["queues"]))
    for key, want in [("partitions", ov["partitions"]), ("messages", ov["messages"]["total"]),
                      ("pending", ov["messages"]["pending"]), ("deadLetter", ov["messages"]["deadLetter"])]:
        check(figure(key) == num(want), f"overview {key}: {figure(key)!r}, the API says {want}")
    check(figure("role") == expect["role"] and figure("health") == "healthy", f"role {figure('role')}, health {figure('health')}, the API says {expect['role']}")
    # Traffic for the throughput chart: pushes to a queue no group reads, over three samples.
    for i in range(3):
        api("/api/v1/push", {"items": [{"queue": "events", "partition": f"p{k}", "payload": {"i": i, "k": k}} for k in range(10 * (i + 1))]})
        time.sleep(2.6)
    wait("a pushed rate on the chart", lambda: (text_of("[data-series='pushed']") or "–") not in ("–", "0"), limit=12)
    pushed_line = "[data-chart='throughput'] polyline.s0"
    wait("two rates on the chart", lambda: len((driver.find_elements(By.CSS_SELECTOR, pushed_line) or [None])[0].get_attribute("points").split()) >= 2
         if driver.find_elements(By.CSS_SELECTOR, pushed_line) else False, limit=12)
    lag = text_of("[data-series='consumer groups']")
    check(lag == num(expect["billingLag"]), f"lag chart shows {lag!r}, the API says {expect['billingLag']}")
    check(len(driver.find_elements(By.CSS_SELECTOR, "[data-chart='throughput'] polyline")) >= 1, "no line on the throughput chart")
    check(driver.find_element(By.ID, "banner").is_displayed() is False, "a banner on a healthy node")
    # The node's own history (it samples its analytics every 500 ms in this test), drawn as
    # soon as the page opens.
    driver.refresh()
    wait("the history charts", lambda: driver.find_elements(By.CSS_SELECTOR, "[data-chart='history'] polyline.s0"), limit=15)
    kept = driver.find_element(By.CSS_SELECTOR, "[data-history]").get_attribute("data-history")
    check(kept.isdigit() and int(kept) > 0, f"history samples: {kept!r}")
    shot("overview")

    # Queues: the list matches /api/v1/resources/queues.
    driver.find_element(By.CSS_SELECTOR, "#nav a[href='#queues']").click()
    wait("the queues table", lambda: any(r and r[0] == "orders" for r in rows()))
    listed = {r[0]: r for r in rows()}
    for q in api("/api/v1/resources/queues")["queues"]:
        r = listed.get(q["name"])
        check(r is not None, f"queue {q['name']} is not listed")
        check(r[3:7] == [num(q["partitionCount"]), num(q["messages"]["total"]), num(q["messages"]["pending"]), num(q["messages"]["deadLetter"])],
              f"queue {q['name']}: {r}, the API says {q}")
    shot("queues")

    # One queue: its partitions.
    driver.find_element(By.LINK_TEXT, "orders").click()
    wait("the queue view", lambda: driver.find_elements(By.CSS_SELECTOR, "#view [data-view='queue']"))
    wait("the partitions", lambda: len(rows()) == 2)
    parts = {r[0]: r for r in rows()}
    check(parts["eu"][2] == "2" and parts["us"][2] == "1", f"partitions: {parts}")
    shot("queue")

    # Consumer groups: billing with the lag the API gave.
    go("groups", "groups")
    wait("the group billing", lambda: any(r and r[0] == "billing" for r in rows()))
    billing = next(r for r in rows() if r[0] == "billing")
    check(billing[1] == "orders" and billing[4] == num(expect["billingLag"]), f"billing: {billing}")
    shot("groups")

    # Messages: every message of orders, the payload as text (never as HTML).
    go("messages?queue=orders&limit=50", "messages")
    wait("three messages", lambda: len(rows()) == 3)
    table = driver.find_element(By.CSS_SELECTOR, "#view table").text
    check("<b>not bold</b>" in table, f"the payload's markup is not shown as text: {table}")
    check(not driver.find_elements(By.CSS_SELECTOR, "#view table td b"), "a payload was parsed as HTML")
    shot("messages")

    # One message, and its retry button calling POST /api/v1/messages/{pid}/{txn}/retry.
    m = expect["message"]
    driver.find_element(By.LINK_TEXT, m["transactionId"]).click()
    wait("the message view", lambda: driver.find_elements(By.CSS_SELECTOR, "#view [data-view='message'] pre.json"))
    check('"order": 1' in text_of("#view pre.json"), f"payload: {text_of('#view pre.json')}")
    # A message that is no dead letter: retry answers the node's 404, shown as such.
    driver.find_element(By.CSS_SELECTOR, "[data-action='retry']").click()
    wait("the retry's answer", lambda: (text_of("[data-action-result]") or "…") != "…")
    answer = text_of("[data-action-result]")
    print(f"retry of a live message answered: {answer}", flush=True)
    check("message_not_found" in answer and "/retry" in answer, f"retry: {answer}")
    shot("message")
    # Delete asks first; a dismissed question calls nothing, an accepted one calls
    # DELETE /api/v1/messages/{pid}/{txn}.
    driver.find_element(By.CSS_SELECTOR, "[data-action='delete']").click()
    WebDriverWait(driver, WAIT).until(lambda d: d.switch_to.alert).dismiss()
    check(text_of("[data-action-result]") == answer, "a dismissed delete called the node")
    driver.find_element(By.CSS_SELECTOR, "[data-action='delete']").click()
    WebDriverWait(driver, WAIT).until(lambda d: d.switch_to.alert).accept()
    wait("the delete's answer", lambda: (text_of("[data-action-result]") or "…") not in ("…", answer))
    deleted = text_of("[data-action-result]")
    print(f"delete answered: {deleted}", flush=True)
    check(deleted.startswith("Deleted"), f"delete: {deleted}")
    go("messages?queue=orders&limit=50", "messages")
    wait("two messages left", lambda: len(rows()) == 2)

    # Dead letters of jobs; its retry button puts it back in the queue.
    go("dlq?queue=jobs", "dlq")
    wait("the dead letter", lambda: any("no such image" in " ".join(r) for r in rows()))
    shot("dlq")
    dead = expect["deadLetter"]
    driver.find_element(By.LINK_TEXT, dead["transactionId"]).click()
    wait("the dead letter's view", lambda: driver.find_elements(By.CSS_SELECTOR, "#view [data-view='message'] pre.json"))
    driver.find_element(By.CSS_SELECTOR, "[data-action='retry']").click()
    wait("the retry's answer", lambda: (text_of("[data-action-result]") or "…") != "…")
    retried = text_of("[data-action-result]")
    print(f"retry of the dead letter answered: {retried}", flush=True)
    check(retried.startswith("Retried") and "#retry" in retried, f"retry: {retried}")
    go("messages?queue=jobs&limit=50", "messages")
    wait("the retried copy, pending", lambda: any(len(r) > 3 and "#retry" in r[2] and r[3] == "pending" for r in rows()))
    go("dlq?queue=jobs", "dlq")
    wait("no dead letter left", lambda: not any("no such image" in " ".join(r) for r in rows()))

    # KV under a prefix.
    go("kv?ns=app&prefix=cfg%2F", "kv")
    wait("the key", lambda: any(r and r[0] == "cfg/colour" for r in rows()))
    check('"purple"' in next(r for r in rows() if r[0] == "cfg/colour")[4], "the KV value")
    shot("kv")

    # Timers of jobs: the one scheduled, its payload decoded from base64.
    go("timers?queue=jobs", "timers")
    wait("the timer", lambda: any(r and r[0] == "user/42" for r in rows()))
    check('{"remind":true}' in next(r for r in rows() if r[0] == "user/42")[6], f"timer: {rows()}")
    shot("timers")

    # Ephemeral queues: rooms with its two messages.
    go("ephemeral", "ephemeral")
    wait("the ephemeral queue", lambda: any(r and r[0] == "rooms" for r in rows()))
    check(next(r for r in rows() if r[0] == "rooms")[2] == "2", f"ephemeral: {rows()}")
    shot("ephemeral")

    # The S3 sink (one local folder for the three nodes): both queues committed their messages,
    # each row with the figures of the node that writes the queue (this one or another).
    # Columns: queue, state, held by, figures from, last window, complete through, lag, windows,
    # records, bytes, lost, last error.
    blank = [""] * 12
    go("sink", "sink")
    for _ in range(30):
        sunk = {r[0]: r for r in rows()}
        # orders keeps its deleted message in the log (and so in the lake); jobs holds the dead
        # letter and its retried copy.
        if sunk.get("orders", blank)[8] == "3" and sunk.get("jobs", blank)[8] == "2":
            break
        time.sleep(1)
        reload("sink")
    for q, want in [("orders", "3"), ("jobs", "2")]:
        r = sunk.get(q, blank)
        check(r[8] == want, f"sink rows: {sunk}")
        check(r[2] not in ("", "–") and r[3] not in ("", "–") and r[4].startswith("#"), f"sink row of {q}: {r}")
        check(r[10] == "0" and r[11] == "–", f"sink row of {q}: {r}")
    writers = {sunk[q][3] for q in ("orders", "jobs")}
    print(f"sink figures from nodes {sorted(writers)}", flush=True)
    check(figure("phase") == "running" and figure("reachable") == "yes", f"sink {figure('phase')} {figure('reachable')}")
    shot("sink")

    # The replicated log: three members, one the leader, each node's own figures.
    log_view(3)

    # The refused retry answers an error (the page shows it); nothing else may.
    errors = [l for l in driver.get_log("browser") if l["level"] == "SEVERE" and "/retry" not in l["message"]]
    check(not errors, f"console errors: {errors}")

    # Broker JWT: the page asks for a token, uses it, keeps it for the tab, and asks again
    # when the node refuses it.
    driver.get(f"{jwt_url}/#overview")
    wait("the token prompt", lambda: driver.find_element(By.ID, "login").is_displayed())
    shot("login")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button[type='submit']").click()
    wait("the overview with the token", lambda: figure("role") == "leader" and figure("queues") == "0")
    check(not driver.find_element(By.ID, "login").is_displayed(), "the prompt stayed")
    driver.refresh()
    wait("the overview after a reload", lambda: figure("queues") == "0")
    check(not driver.find_element(By.ID, "login").is_displayed(), "the token was not kept for the tab")
    driver.execute_script("sessionStorage.setItem('queen.token', 'not-a-token')")
    driver.refresh()
    wait("the prompt for a refused token", lambda: driver.find_element(By.ID, "login").is_displayed())
    check("refused" in driver.find_element(By.ID, "login-why").text, driver.find_element(By.ID, "login-why").text)

    # A node whose disk gate is closed: the banner says so on every view.
    driver.get(f"{full_url}/#queues")
    wait("the disk gate's banner", lambda: "Disk gate closed" in driver.find_element(By.ID, "banner").text)
    check(driver.find_element(By.ID, "banner").is_displayed(), "the banner is hidden")
    shot("banner")

    print(f"dashboard browser ok in {time.monotonic() - started:.1f} s", flush=True)
finally:
    driver.quit()
