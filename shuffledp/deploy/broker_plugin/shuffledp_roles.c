/*
 * shuffledp_roles: per-role limits for mosquitto 2.0 (plugin API version 5).
 *
 * mosquitto 2.0's retain, packet-size and queue settings apply to the whole broker.
 * This plugin adds limits per *role* (analyzer, shuffler, client: the roles of the
 * ACL that shuffledp.deploy.broker writes). It can only refuse more than the password file
 * and the ACL file already refuse, never allow more:
 *
 *   MOSQ_EVT_ACL_CHECK   for a PUBLISH from a connected user (access MOSQ_ACL_WRITE):
 *                        refuse a payload over the role's size limit, and a retained
 *                        publish on a topic where the role may not retain. Otherwise
 *                        (and for every read/subscribe check) return
 *                        MOSQ_ERR_PLUGIN_DEFER, so the acl_file decides.
 *   MOSQ_EVT_MESSAGE     for the same PUBLISH, once the ACL allowed it: refuse it if
 *                        its payload plus its MQTT 5 properties (user properties,
 *                        content type, correlation data, response topic, payload
 *                        format: those the broker passes on to subscribers, counted as
 *                        encoded in the packet) exceed the role's size limit. The ACL
 *                        event of mosquitto 2.0 does not show the properties; this one
 *                        does, before the message is stored or queued.
 *   MOSQ_EVT_BASIC_AUTH  refuse a connection whose client id is held by a live
 *                        connection of *another* username (see below), one with MQTT 5
 *                        or with a session kept after it closes (clean session off)
 *                        from a role that may not use them, and one that would exceed
 *                        the role's limit of simultaneous connections per username;
 *                        otherwise DEFER, so the password_file decides. A
 *                        new connection with the client id of an existing one of the
 *                        same username is not counted (MQTT session takeover: the
 *                        broker closes the old one), so a device reconnecting before
 *                        the broker noticed its dead connection is not locked out.
 *   MOSQ_EVT_DISCONNECT  forget a connection recorded at BASIC_AUTH.
 *
 * Client ids. mosquitto lets any authenticated CONNECT take over the session of the
 * same client id, whoever holds it: the old connection is closed. So a client account
 * that learns the shuffler's client id could knock it off, again and again. This
 * plugin records every connection that has a username (client id, username) and
 * refuses a CONNECT whose client id a connection of another username holds; the same
 * username may still take over its own client id (a restarted device or service).
 * Event order in mosquitto 2.0.11 (handle__connect): BASIC_AUTH for the new
 * connection runs first, with the old one still connected and recorded; only once
 * the new one is authorised (connect__on_authorised) does the broker close the old
 * one, which raises DISCONNECT for the old connection (its own client pointer, so
 * only its record goes). A refused or failed login raises DISCONNECT for itself in
 * the same loop iteration; a refusal here records nothing. Offline (persistent)
 * sessions hold no client id here: shuffledp's parties use clean sessions.
 *
 * Sessions. The connection limit counts live connections; a session the broker keeps
 * after its connection closed (MQTT 3.1.1 clean session off; MQTT 5 with a session
 * expiry) is not one, yet it queues every message of its subscriptions. A role with
 * <role>_persistent_sessions 0 gets clean sessions only: at BASIC_AUTH the broker has
 * parsed the CONNECT, so mosquitto_client_clean_session tells the flag. MQTT 5 keeps a
 * session also with clean start on when the CONNECT sets a session expiry, which the
 * plugin API of mosquitto 2.0 does not show: such a role must also have <role>_mqtt5 0
 * (shuffledp.deploy.broker.RoleLimits enforces it), which refuses MQTT 5 (protocol
 * version 5, mosquitto_client_protocol_version) outright. Neither MQTT 3.1 nor 3.1.1
 * has properties or a session expiry.
 *
 * Options (plugin_opt_<key> <value> in mosquitto.conf):
 *   roles_file             file of "username role" lines; a user not in it may
 *                          publish nothing (the broker's users all are);
 *   <role>_max_payload     largest PUBLISH payload of the role, bytes (0: no limit
 *                          beyond the broker's max_packet_size);
 *   <role>_max_connections simultaneous connections per username (0: no limit);
 *   <role>_retain          comma-separated topic filters (+ and #) on which the role
 *                          may publish retained messages; "-" or empty: none;
 *   <role>_mqtt5           1: the role may connect with MQTT 5; 0: it may not
 *                          (default 1);
 *   <role>_persistent_sessions
 *                          1: the role may ask the broker to keep its session after
 *                          the connection closes; 0: clean sessions only (default 1).
 *
 * Written for shuffledp; built by shuffledp.deploy.broker with the system C compiler (headers:
 * Debian packages mosquitto-dev and libmosquitto-dev):
 *   cc -shared -fPIC -O2 -o shuffledp_roles.so shuffledp_roles.c
 */

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>
#include <mqtt_protocol.h>

#define MAX_ROLES 16
#define MAX_NAME 64
#define MAX_RETAIN_FILTERS 16

struct role {
	char name[MAX_NAME + 1];
	unsigned long long max_payload;   /* 0: no limit */
	unsigned long max_connections;    /* 0: no limit */
	char *retain[MAX_RETAIN_FILTERS];  /* topic filters where retain is allowed */
	int retain_count;
	bool no_mqtt5;                    /* refuse MQTT 5 connections */
	bool clean_sessions_only;         /* refuse a CONNECT with clean session off */
};

struct user {
	char *username;
	int role;
};

/* One live connection that has a username (recorded at BASIC_AUTH, forgotten at DISCONNECT). */
struct connection {
	const struct mosquitto *client;
	char *username;
	char *client_id;
};

static mosquitto_plugin_id_t *plugin_id = NULL;
static struct role roles[MAX_ROLES];
static int role_count = 0;
static struct user *users = NULL;
static size_t user_count = 0;
static struct connection *connections = NULL;
static size_t connection_count = 0;
static size_t connection_capacity = 0;
static time_t last_denial_log = 0;
static unsigned long denials_since_log = 0;
static time_t last_refusal_log = 0;
static unsigned long refusals_since_log = 0;

static char *copy_string(const char *s)
{
	size_t n = strlen(s) + 1;
	char *out = malloc(n);
	if(out) memcpy(out, s, n);
	return out;
}

static int find_role(const char *name, size_t len)
{
	for(int i = 0; i < role_count; i++){
		if(strlen(roles[i].name) == len && !strncmp(roles[i].name, name, len)) return i;
	}
	return -1;
}

/* The role called name[0:len], created if new; -1 if the table is full or the name invalid. */
static int get_role(const char *name, size_t len)
{
	int i = find_role(name, len);
	if(i >= 0) return i;
	if(len == 0 || len > MAX_NAME || role_count == MAX_ROLES) return -1;
	memset(&roles[role_count], 0, sizeof(struct role));
	memcpy(roles[role_count].name, name, len);
	roles[role_count].name[len] = '\0';
	return role_count++;
}

static int user_role(const char *username)
{
	if(username == NULL) return -1;
	for(size_t i = 0; i < user_count; i++){
		if(!strcmp(users[i].username, username)) return users[i].role;
	}
	return -1;
}

/* MQTT topic filter matching: '+' one level, '#' (last) any number of levels, incl. none. */
static bool topic_matches(const char *filter, const char *topic)
{
	while(*filter){
		if(filter[0] == '#' && filter[1] == '\0') return true;
		if(filter[0] == '+' && (filter[1] == '/' || filter[1] == '\0')){
			while(*topic && *topic != '/') topic++;
			filter++;
		}else{
			while(*filter && *filter != '/'){
				if(*filter != *topic) return false;
				filter++;
				topic++;
			}
			if(*topic && *topic != '/') return false;
		}
		/* both at a '/' or at the end */
		if(*filter == '\0') return *topic == '\0';
		if(*topic == '\0'){
			/* "a/#" also matches "a" */
			return filter[0] == '/' && filter[1] == '#' && filter[2] == '\0';
		}
		filter++;
		topic++;
	}
	return *topic == '\0';
}

static bool parse_unsigned(const char *text, unsigned long long *out)
{
	char *end = NULL;
	if(text == NULL || *text == '\0' || *text == '-') return false;
	errno = 0;
	unsigned long long value = strtoull(text, &end, 10);
	if(errno || *end != '\0') return false;
	*out = value;
	return true;
}

static int set_retain_filters(struct role *r, const char *value)
{
	const char *p = value;
	if(!strcmp(value, "-")) return MOSQ_ERR_SUCCESS;
	while(*p){
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if(len > 0){
			if(r->retain_count == MAX_RETAIN_FILTERS) return MOSQ_ERR_INVAL;
			char *filter = malloc(len + 1);
			if(!filter) return MOSQ_ERR_NOMEM;
			memcpy(filter, p, len);
			filter[len] = '\0';
			r->retain[r->retain_count++] = filter;
		}
		p += len;
		if(*p == ',') p++;
	}
	return MOSQ_ERR_SUCCESS;
}

static int load_roles_file(const char *path)
{
	FILE *f = fopen(path, "r");
	char line[512];
	if(!f){
		mosquitto_log_printf(MOSQ_LOG_ERR, "shuffledp_roles: cannot open roles_file %s", path);
		return MOSQ_ERR_INVAL;
	}
	while(fgets(line, sizeof(line), f)){
		char name[MAX_NAME + 2], role[MAX_NAME + 2];
		if(line[0] == '#' || line[0] == '\n') continue;
		if(sscanf(line, "%65s %65s", name, role) != 2 || strlen(name) > MAX_NAME){
			mosquitto_log_printf(MOSQ_LOG_ERR, "shuffledp_roles: bad line in %s: %s", path, line);
			fclose(f);
			return MOSQ_ERR_INVAL;
		}
		int r = get_role(role, strlen(role));
		struct user *grown = realloc(users, (user_count + 1) * sizeof(struct user));
		if(r < 0 || !grown){
			fclose(f);
			return r < 0 ? MOSQ_ERR_INVAL : MOSQ_ERR_NOMEM;
		}
		users = grown;
		users[user_count].username = copy_string(name);
		users[user_count].role = r;
		if(!users[user_count].username){
			fclose(f);
			return MOSQ_ERR_NOMEM;
		}
		user_count++;
	}
	fclose(f);
	return MOSQ_ERR_SUCCESS;
}

static int apply_option(const char *key, const char *value)
{
	/* "_persistent_sessions" before any suffix it ends with; none ends another here */
	static const char *suffixes[] = {"_max_payload", "_max_connections", "_retain", "_mqtt5", "_persistent_sessions"};
	size_t key_len = strlen(key);

	if(!strcmp(key, "roles_file")) return load_roles_file(value);
	for(int s = 0; s < 5; s++){
		size_t suffix_len = strlen(suffixes[s]);
		if(key_len <= suffix_len || strcmp(key + key_len - suffix_len, suffixes[s])) continue;
		int r = get_role(key, key_len - suffix_len);
		unsigned long long number = 0;
		if(r < 0) return MOSQ_ERR_INVAL;
		if(s == 2) return set_retain_filters(&roles[r], value);
		if(!parse_unsigned(value, &number)) return MOSQ_ERR_INVAL;
		if(s >= 3 && number > 1) return MOSQ_ERR_INVAL; /* a flag: 0 or 1 */
		if(s == 0) roles[r].max_payload = number;
		else if(s == 1) roles[r].max_connections = (unsigned long)number;
		else if(s == 3) roles[r].no_mqtt5 = (number == 0);
		else roles[r].clean_sessions_only = (number == 0);
		return MOSQ_ERR_SUCCESS;
	}
	return MOSQ_ERR_INVAL;
}

/* Log a refused publish, at most once a second (a flood must not flood the log too). */
static void log_denial(const char *username, const char *topic, const char *why, unsigned long long size)
{
	time_t now = time(NULL);
	denials_since_log++;
	if(now == last_denial_log) return;
	mosquitto_log_printf(MOSQ_LOG_NOTICE,
			"shuffledp_roles: refused PUBLISH from %s to %s: %s (%llu bytes; %lu refusal(s) since the last line)",
			username ? username : "(anonymous)", topic, why, size, denials_since_log);
	last_denial_log = now;
	denials_since_log = 0;
}

static int on_acl_check(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_acl_check *ed = event_data;
	(void)event;
	(void)userdata;

	if(ed->access != MOSQ_ACL_WRITE) return MOSQ_ERR_PLUGIN_DEFER;
	const char *username = mosquitto_client_username(ed->client);
	int r = user_role(username);
	if(r < 0){
		log_denial(username, ed->topic, "user has no role", ed->payloadlen);
		return MOSQ_ERR_ACL_DENIED;
	}
	const struct role *role = &roles[r];
	if(role->max_payload && ed->payloadlen > role->max_payload){
		log_denial(username, ed->topic, "payload over the role's limit", ed->payloadlen);
		return MOSQ_ERR_ACL_DENIED;
	}
	if(ed->retain){
		bool allowed = false;
		for(int i = 0; i < role->retain_count && !allowed; i++){
			allowed = topic_matches(role->retain[i], ed->topic);
		}
		if(!allowed){
			log_denial(username, ed->topic, "the role may not retain on this topic", ed->payloadlen);
			return MOSQ_ERR_ACL_DENIED;
		}
	}
	return MOSQ_ERR_PLUGIN_DEFER; /* the acl_file decides */
}

/* Bytes of a variable byte integer (MQTT 5, section 1.5.5). */
static unsigned varint_size(uint32_t value)
{
	return value < 128 ? 1 : value < 16384 ? 2 : value < 2097152 ? 3 : 4;
}

/* The bytes properties take in the packet (each property's identifier and value; the
 * length in front of the list is not counted), through the public property API (whose
 * readers copy each value once: no more work than the broker's own reading of the
 * packet). ULLONG_MAX for a property it cannot read, so it is never under-counted. */
static unsigned long long properties_size(const mosquitto_property *properties)
{
	unsigned long long total = 0;
	for(const mosquitto_property *p = properties; p; p = mosquitto_property_next(p)){
		int id = mosquitto_property_identifier(p), check = 0, type = 0;
		const char *name = mosquitto_property_identifier_to_string(id);
		if(name == NULL || mosquitto_string_to_property_info(name, &check, &type) != MOSQ_ERR_SUCCESS || check != id){
			return ULLONG_MAX;
		}
		total += varint_size((uint32_t)id);
		switch(type){
			case MQTT_PROP_TYPE_BYTE: total += 1; break;
			case MQTT_PROP_TYPE_INT16: total += 2; break;
			case MQTT_PROP_TYPE_INT32: total += 4; break;
			case MQTT_PROP_TYPE_VARINT: {
				uint32_t value = 0;
				if(!mosquitto_property_read_varint(p, id, &value, false)) return ULLONG_MAX;
				total += varint_size(value);
				break;
			}
			case MQTT_PROP_TYPE_BINARY: {
				void *value = NULL;
				uint16_t len = 0;
				if(!mosquitto_property_read_binary(p, id, &value, &len, false)) return ULLONG_MAX;
				mosquitto_free(value);
				total += 2 + (unsigned long long)len;
				break;
			}
			case MQTT_PROP_TYPE_STRING: {
				char *value = NULL;
				if(!mosquitto_property_read_string(p, id, &value, false)) return ULLONG_MAX;
				total += 2 + (unsigned long long)(value ? strlen(value) : 0);
				mosquitto_free(value);
				break;
			}
			case MQTT_PROP_TYPE_STRING_PAIR: {
				char *key = NULL, *value = NULL;
				if(!mosquitto_property_read_string_pair(p, id, &key, &value, false)) return ULLONG_MAX;
				total += 4 + (unsigned long long)(key ? strlen(key) : 0) + (value ? strlen(value) : 0);
				mosquitto_free(key);
				mosquitto_free(value);
				break;
			}
			default:
				return ULLONG_MAX;
		}
	}
	return total;
}

static int on_message(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_message *ed = event_data;
	(void)event;
	(void)userdata;

	if(ed->properties == NULL) return MOSQ_ERR_SUCCESS; /* MQTT 3.1/3.1.1, or none: the ACL check counted it all */
	const char *username = mosquitto_client_username(ed->client);
	int r = user_role(username);
	if(r < 0){
		log_denial(username, ed->topic, "user has no role", ed->payloadlen);
		return MOSQ_ERR_ACL_DENIED;
	}
	unsigned long long limit = roles[r].max_payload;
	if(limit == 0) return MOSQ_ERR_SUCCESS;
	unsigned long long size = properties_size(ed->properties);
	if(size == ULLONG_MAX){
		log_denial(username, ed->topic, "an MQTT 5 property the plugin cannot size", ed->payloadlen);
		return MOSQ_ERR_ACL_DENIED;
	}
	size += ed->payloadlen;
	if(size > limit){
		log_denial(username, ed->topic, "payload and MQTT 5 properties over the role's limit", size);
		return MOSQ_ERR_ACL_DENIED;
	}
	return MOSQ_ERR_SUCCESS;
}

static void forget_connection(const struct mosquitto *client)
{
	for(size_t i = 0; i < connection_count; i++){
		if(connections[i].client == client){
			free(connections[i].username);
			free(connections[i].client_id);
			connections[i] = connections[--connection_count];
			return;
		}
	}
}

/* Log a refused CONNECT, at most once a second (a client retrying in a loop must not
 * flood the log); the line counts the refusals since the last one. */
static void log_refused_connection(const char *client_id, const char *username, const char *why)
{
	time_t now = time(NULL);
	refusals_since_log++;
	if(now == last_refusal_log) return;
	mosquitto_log_printf(MOSQ_LOG_NOTICE,
			"shuffledp_roles: refused connection %s of %s: %s (%lu refusal(s) since the last line)",
			client_id, username, why, refusals_since_log);
	last_refusal_log = now;
	refusals_since_log = 0;
}

static int on_basic_auth(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_basic_auth *ed = event_data;
	char why[160];
	(void)event;
	(void)userdata;

	if(ed->username == NULL) return MOSQ_ERR_PLUGIN_DEFER; /* anonymous: the broker refuses */
	const char *client_id = mosquitto_client_id(ed->client);
	if(client_id == NULL) client_id = "";
	forget_connection(ed->client); /* never record one connection twice */

	/* The client id rule: a live connection of another username holds it. */
	for(size_t i = 0; i < connection_count; i++){
		if(!strcmp(connections[i].client_id, client_id) && strcmp(connections[i].username, ed->username)){
			snprintf(why, sizeof(why), "client id in use by another username (%s)", connections[i].username);
			log_refused_connection(client_id, ed->username, why);
			return MOSQ_ERR_AUTH;
		}
	}

	int r = user_role(ed->username);
	if(r >= 0 && roles[r].no_mqtt5 && mosquitto_client_protocol_version(ed->client) == 5){
		snprintf(why, sizeof(why), "role %s may not use MQTT 5 (MQTT 3.1.1 only)", roles[r].name);
		log_refused_connection(client_id, ed->username, why);
		return MOSQ_ERR_AUTH;
	}
	if(r >= 0 && roles[r].clean_sessions_only && !mosquitto_client_clean_session(ed->client)){
		snprintf(why, sizeof(why), "role %s: clean sessions only (clean session was off)", roles[r].name);
		log_refused_connection(client_id, ed->username, why);
		return MOSQ_ERR_AUTH;
	}
	if(r >= 0 && roles[r].max_connections > 0){
		unsigned long others = 0;
		for(size_t i = 0; i < connection_count; i++){
			if(!strcmp(connections[i].username, ed->username) && strcmp(connections[i].client_id, client_id)){
				others++;
			}
		}
		if(others >= roles[r].max_connections){
			snprintf(why, sizeof(why), "role %s: already %lu connection(s), the role's limit", roles[r].name, others);
			log_refused_connection(client_id, ed->username, why);
			return MOSQ_ERR_AUTH;
		}
	}
	if(connection_count == connection_capacity){
		size_t capacity = connection_capacity ? 2 * connection_capacity : 64;
		struct connection *grown = realloc(connections, capacity * sizeof(struct connection));
		if(!grown) return MOSQ_ERR_NOMEM;
		connections = grown;
		connection_capacity = capacity;
	}
	struct connection *c = &connections[connection_count];
	c->client = ed->client;
	c->username = copy_string(ed->username);
	c->client_id = copy_string(client_id);
	if(!c->username || !c->client_id){
		free(c->username);
		free(c->client_id);
		return MOSQ_ERR_NOMEM;
	}
	connection_count++;
	return MOSQ_ERR_PLUGIN_DEFER; /* the password_file decides */
}

static int on_disconnect(int event, void *event_data, void *userdata)
{
	struct mosquitto_evt_disconnect *ed = event_data;
	(void)event;
	(void)userdata;
	forget_connection(ed->client);
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
	for(int i = 0; i < supported_version_count; i++){
		if(supported_versions[i] == 5) return 5;
	}
	return -1;
}

static void free_all(void)
{
	for(int r = 0; r < role_count; r++){
		for(int i = 0; i < roles[r].retain_count; i++) free(roles[r].retain[i]);
	}
	role_count = 0;
	for(size_t i = 0; i < user_count; i++) free(users[i].username);
	free(users);
	users = NULL;
	user_count = 0;
	for(size_t i = 0; i < connection_count; i++){
		free(connections[i].username);
		free(connections[i].client_id);
	}
	free(connections);
	connections = NULL;
	connection_count = connection_capacity = 0;
}

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata, struct mosquitto_opt *options, int option_count)
{
	int rc;
	(void)userdata;
	plugin_id = identifier;
	for(int i = 0; i < option_count; i++){
		rc = apply_option(options[i].key, options[i].value ? options[i].value : "");
		if(rc != MOSQ_ERR_SUCCESS){
			mosquitto_log_printf(MOSQ_LOG_ERR, "shuffledp_roles: invalid option plugin_opt_%s %s",
					options[i].key, options[i].value ? options[i].value : "");
			free_all();
			return rc;
		}
	}
	if((rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL, NULL))
			|| (rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL, NULL))
			|| (rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL, NULL))
			|| (rc = mosquitto_callback_register(plugin_id, MOSQ_EVT_DISCONNECT, on_disconnect, NULL, NULL))){
		free_all();
		return rc;
	}
	for(int r = 0; r < role_count; r++){
		mosquitto_log_printf(MOSQ_LOG_NOTICE,
				"shuffledp_roles: role %s: payload <= %llu bytes, <= %lu connection(s) per username, retain on %d filter(s) (0 = no limit), "
				"MQTT 5 %s, %s",
				roles[r].name, roles[r].max_payload, roles[r].max_connections, roles[r].retain_count,
				roles[r].no_mqtt5 ? "refused" : "allowed",
				roles[r].clean_sessions_only ? "clean sessions only" : "persistent sessions allowed");
	}
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *options, int option_count)
{
	(void)userdata;
	(void)options;
	(void)option_count;
	if(plugin_id){
		mosquitto_callback_unregister(plugin_id, MOSQ_EVT_ACL_CHECK, on_acl_check, NULL);
		mosquitto_callback_unregister(plugin_id, MOSQ_EVT_MESSAGE, on_message, NULL);
		mosquitto_callback_unregister(plugin_id, MOSQ_EVT_BASIC_AUTH, on_basic_auth, NULL);
		mosquitto_callback_unregister(plugin_id, MOSQ_EVT_DISCONNECT, on_disconnect, NULL);
	}
	free_all();
	return MOSQ_ERR_SUCCESS;
}
